"""Host memory past the live tensors: oneDNN's kernel caches stay bounded, and freed heap
goes back to the system (``agentrl.parallel.caches``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agentrl.parallel.caches import KERNEL_CACHE_ENTRIES, bound_kernel_caches

RESIDENT = """
def resident_mib():
    from agentrl.parallel.caches import trim_host_heap
    trim_host_heap()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
"""

NEW_SHAPES = RESIDENT + """
from agentrl.parallel.caches import bound_kernel_caches
bound_kernel_caches()
import json, torch
torch.set_num_threads(1)
weight = torch.randn(1536, 512, dtype=torch.bfloat16, requires_grad=True)
rows = torch.randn(800, 512, dtype=torch.bfloat16)
torch.nn.functional.linear(rows[:8], weight).sum().backward()
start = resident_mib()
for length in range(600, 800):  # a micro-batch of each length: forward and both grads
    x = rows[:length].clone().requires_grad_()
    torch.nn.functional.linear(x, weight).sum().backward()
print(json.dumps(resident_mib() - start))
"""

FREED_HEAP = """
import json, sys, torch
from agentrl.parallel.caches import return_freed_heap
count = int(sys.argv[1])
small = [torch.ones(20_000 + i) for i in range(count)]  # ~80 KB each: glibc's heap
kept = small[::50]  # a few survivors pin the heap's top: only a trim gives the rest back
del small
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
before = rss()
returned = return_freed_heap()
print(json.dumps([returned, before - rss()]))
"""


def _run(script: str, *args: str, **env: str) -> Any:
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_ENTRIES}
    done = subprocess.run([sys.executable, "-c", script, *args], env={**clean, **env},
                          check=True, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bound_kernel_caches_sets_the_caps_and_keeps_a_users_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(
        KERNEL_CACHE_ENTRIES["ONEDNN_PRIMITIVE_CACHE_CAPACITY"])
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_bounded_kernel_caches_keep_resident_memory_from_growing_with_new_shapes() -> None:
    """200 lengths of a bf16 linear layer, forward and backward: 600 kernels. Bounded,
    the process holds what the caps allow; with the old default of 1,024 entries each (a
    user's explicit setting, which ``bound_kernel_caches`` keeps) it holds them all."""
    bounded = _run(NEW_SHAPES)
    unbounded = _run(NEW_SHAPES, **dict.fromkeys(KERNEL_CACHE_ENTRIES, "1024"))
    assert bounded < 0.5 * unbounded, (bounded, unbounded)
    assert bounded < 200, f"resident memory grew {bounded:.0f} MiB with the caches bounded"


def test_a_large_freed_heap_goes_back_to_the_system_and_a_small_one_stays() -> None:
    returned, dropped = _run(FREED_HEAP, "8000")  # ~640 MB allocated, 98% of it freed
    assert returned and dropped > 300, f"gave back only {dropped:.0f} MiB"
    returned, dropped = _run(FREED_HEAP, "800")  # ~64 MB freed: kept for the next phase
    assert not returned and abs(dropped) < 16


def test_micro_batches_are_padded_where_kernels_are_built_per_shape() -> None:
    import torch

    from agentrl.parallel.caches import REPEATING_TOKEN_MULTIPLE, token_multiple

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert token_multiple(None, torch.bfloat16, cpu) == REPEATING_TOKEN_MULTIPLE
    assert token_multiple(None, torch.float16, "cpu") == REPEATING_TOKEN_MULTIPLE
    assert token_multiple(None, torch.float32, cpu) == 1  # MKL: no kernel per shape
    assert token_multiple(None, torch.bfloat16, gpu) == 1
    assert token_multiple(8, torch.float32, cpu) == 8  # the configured value wins
    assert token_multiple(1, torch.bfloat16, cpu) == 1

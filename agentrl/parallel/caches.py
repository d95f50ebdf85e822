"""Memory and time a process spends past its live tensors: oneDNN's per-shape kernel
caches kept bounded and their shapes made to repeat, CUDA's cached blocks and glibc's
freed heap given back between phases."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: the caches are bounded before it loads
    import torch

KERNEL_CACHE_ENTRIES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 256, "LRU_CACHE_CAPACITY": 32}
"""Entries kept by oneDNN's primitive cache (compiled kernels, one per shape and pass of a
bf16 matmul on a CPU) and by torch's ideep cache of the operations wrapping them, for the
most recent shapes. Every packed micro-batch and decode batch has a shape of its own, and
each entry held about 0.5 MB (primitive) and 0.35 MB (ideep) on the AMX CPU where this was
measured. With the default 1,024 of each, the 8-layer bf16 peer bench grew by ~70 MB a
step (1.88 GB after 6 steps). A miss costs a compilation (1 to 2 ms), so the primitive
cache keeps more: at 32 entries the quickstart model ran 20% slower in bf16, at 256 about
8%, and the 8-layer bench levels off at 1.45 to 1.46 GB (docs/peers.md); the ideep cache
costs little when the primitive cache hits. Since training micro-batches are padded to
repeating shapes (:func:`token_multiple`) the 256-entry cap costs the quickstart model
nothing measurable (0.210 against 0.209 s a step uncapped, 20 steps, 50 MB less)."""


def bound_kernel_caches() -> None:
    """Cap oneDNN's kernel caches (:data:`KERNEL_CACHE_ENTRIES`) so resident memory stops
    growing with each new tensor shape. A value already in the environment wins (the
    user's choice). Takes effect only before the process's first oneDNN kernel (a bf16
    matmul on a CPU), so the command line and the run's setup call it first."""
    for name, count in KERNEL_CACHE_ENTRIES.items():
        os.environ.setdefault(name, str(count))


REPEATING_TOKEN_MULTIPLE = 64
"""Token multiple that training micro-batches are padded to where kernels are built per
shape (:func:`token_multiple`). On the quickstart model in bf16 it took the update from
0.118 to 0.073 s a step (float32: 0.083); the padding adds under 2 × 64 tokens to a
micro-batch (docs/peers.md)."""


def token_multiple(configured: int | None, compute: torch.dtype,
                   device: torch.device | str) -> int:
    """What training micro-batches are padded to (``batch.token_multiple``): the configured
    value, else :data:`REPEATING_TOKEN_MULTIPLE` where a matmul builds a kernel for each
    new shape (oneDNN: bf16 or fp16 on a CPU; float32 goes to MKL, which builds none) so
    that a few shapes repeat, else 1 (no padding)."""
    import torch

    if configured is not None:
        return configured
    per_shape = torch.device(device).type == "cpu" and compute in (torch.bfloat16,
                                                                    torch.float16)
    return REPEATING_TOKEN_MULTIPLE if per_shape else 1


FREED_HEAP_WORTH_RETURNING = 256 * 2**20
"""Freed heap below which :func:`return_freed_heap` keeps it for the next phase. Returned,
the pages fault in afresh when the next phase allocates: that cost the quickstart model's
update 6 to 10% for nothing (its freed heap is 50 to 70 MB, and its peak did not move),
while at the 8-layer bench (275 to 560 MB freed) returning it kept the bf16 peak at
1,446 to 1,461 MB instead of 1,568 to 1,719 MB."""


def return_freed_heap(at_least: int = FREED_HEAP_WORTH_RETURNING) -> bool:
    """Give glibc's freed heap back to the system between a run's phases when it holds at
    least ``at_least`` bytes, so that the next phase's peak starts from the live tensors
    rather than from the last phase's peak; returns whether it did."""
    free = _free_heap_bytes()
    if free is None or free < at_least:
        return False
    trim_host_heap()
    return True


def trim_host_heap() -> None:
    """Give glibc's freed heap back to the system (``malloc_trim``), so that resident
    memory follows the live tensors. A no-op where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_cached_memory() -> None:
    """Hand the blocks this process's CUDA allocator caches (the trainer's freed
    activations and gradients) back to the driver, so that a colocated vLLM replica waking
    up finds them free: vLLM allocates outside torch's cache, and without this the GPU
    would hold the training peak and the engine's share at once."""
    import torch  # here: the command line bounds the caches before torch is imported

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    return getattr(_glibc(), "malloc_trim", None)


class _MallocInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _free_heap_bytes() -> int | None:
    """Bytes freed but kept by glibc's heap (``mallinfo2``); None without glibc 2.33+."""
    info = getattr(_glibc(), "mallinfo2", None)
    if info is None:
        return None
    info.restype = _MallocInfo
    return int(info().fordblks)

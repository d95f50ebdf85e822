"""`agentrl serve` with rollout.engine = "vllm" runs `vllm serve` with the documented
flags; the same client that drives the built-in server (RemoteEngine) generates on it
token-in/token-out and pushes weights through vLLM's weight-transfer routes (gloo on CPU)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest

from agentrl.engines.collective import free_port
from agentrl.engines.interface import SamplingParams
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.vllm_setup import vllm_available
from tests.test_vllm_cpu.test_vllm_engine import (
    PROMPTS,
    forward_logprobs,
    generate_all,
    torch_greedy,
)

pytestmark = pytest.mark.vllm

CONFIG = """
[model]
path = "{model}"
[rollout]
engine = "vllm"
max_rollout_tokens = 64
vllm_args = {{ enforce_eager = true, kv_cache_memory_bytes = 33554432 }}
[compaction]
strategy = "drop_oldest"
max_context_tokens = 128
[[environments]]
id = "agentrl/Countdown-v0"
"""


def wait_until_up(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"vllm serve did not come up within {timeout_s} s")


def test_one_client_drives_vllm_serve(ckpt_a, model_a, model_b, tmp_path):
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    config = tmp_path / "serve.toml"
    config.write_text(CONFIG.format(model=ckpt_a))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", str(config),
                             "--host", "127.0.0.1", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout_s=300)
        remote = RemoteEngine(url, sync_timeout_s=60).connect()
        assert not remote.is_agentrl and remote.served_version() == 0
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        got = generate_all(remote, PROMPTS, [greedy] * len(PROMPTS))
        assert [g.token_ids for g in got] == [w.token_ids for w in torch_greedy(model_a,
                                                                                PROMPTS, 12)]
        sampled = [SamplingParams(temperature=0.7, max_tokens=8, seed=i) for i in range(4)]
        for prompt, gen in zip(PROMPTS, generate_all(remote, PROMPTS, sampled), strict=True):
            want = forward_logprobs(model_a, prompt, gen.token_ids, 0.7)
            assert [round(x, 4) for x in gen.logprobs] == pytest.approx(want.tolist(), abs=1e-4)

        remote.update_weights((n, p.detach()) for n, p in model_b.named_parameters())
        assert remote.served_version() == 1
        got = generate_all(remote, PROMPTS, [greedy] * len(PROMPTS))
        assert [g.token_ids for g in got] == [w.token_ids for w in torch_greedy(model_b,
                                                                                PROMPTS, 12)]
    finally:
        proc.terminate()
        proc.wait(timeout=60)

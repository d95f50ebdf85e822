"""The trainer with ``rollout.engine = "vllm"``: rollouts come from vLLM, the update's
weights go back into vLLM in place, and the next generation uses them."""

from __future__ import annotations

import pytest

from agentrl.config import config_from_dict
from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.engines.vllm_setup import vllm_available
from agentrl.model import load_pretrained
from agentrl.observe.writers import read_metrics
from agentrl.parallel.fsdp import full_state_dict
from agentrl.train.run import build_run
from agentrl.train.trainer import train

pytestmark = pytest.mark.vllm


def test_trainer_generates_with_vllm_and_syncs_the_updated_weights(ckpt_a, model_a, tmp_path):
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    config = config_from_dict({
        "model": {"path": str(ckpt_a), "attention": "torch"},
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "global_batch_size": 2},
        "rollout": {"engine": "vllm", "max_new_tokens": 8, "max_turns": 1,
                    "max_rollout_tokens": 8,
                    "vllm_args": {"enforce_eager": True, "kv_cache_memory_bytes": 32 * 2**20,
                                  "sync_timeout_s": 60.0}},
        "optim": {"lr": 1e-2},
        "train": {"num_steps": 2, "seed": 1},
        "log": {"live": False},
        "environments": [{"id": "tests.train.test_train_e2e:ShortAnswerEnv"}],
    })
    run = build_run(config, tmp_path / "run")
    start = {k: v.clone() for k, v in full_state_dict(run.model).items()}
    try:
        train(run)
        first = read_metrics(tmp_path / "run")[0]
        # two updates per collection: the scoring pass compares the trainer's log-probs with
        # vLLM's for the same tokens before any update (fp32 on both sides)
        assert first["loss/mismatch_scored"] < 1e-3
        assert first["num_rollouts"] == 4
        trained = load_pretrained(tmp_path / "run" / "checkpoints" / "step_2")
        moved = any(not v.equal(start[k]) for k, v in trained.state_dict().items())
        assert moved, "training should have changed the weights"
        # vLLM now serves the trained weights: its greedy tokens are the trained model's
        greedy = SamplingParams(temperature=0.0, max_tokens=10)
        prompt = run.tokenizer.encode("Say 123.")
        served = run.loop.run_until_complete(run.engine.generate(prompt, greedy))
        reference = run.loop.run_until_complete(
            TorchEngine(trained, max_batch_size=1, max_len=64).generate(prompt, greedy))
        assert served.token_ids == reference.token_ids
        # ...and not the starting weights' (else this check could not fail)
        initial = run.loop.run_until_complete(
            TorchEngine(model_a, max_batch_size=1, max_len=64).generate(prompt, greedy))
        assert initial.token_ids != reference.token_ids
    finally:
        run.engine.shutdown()

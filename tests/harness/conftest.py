"""Harness tests: a tiny checkpoint, configs whose environments are agent programs, and a
collection through the real runner and endpoint with an engine that remembers what it
was asked (to check that every row holds exactly what the engine saw)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import config_from_dict
from agentrl.engines.build import build_engines
from agentrl.model import build_tiny_checkpoint, load_tokenizer, read_args
from agentrl.rollout.build import build_runner, build_sampler
from agentrl.rollout.request_keys import split_key

HERE = Path(__file__).resolve().parent
AGENTS = HERE / "agents"
ROOT = HERE.parents[1]
SFT = ROOT / "assets" / "calc-countdown-sft"
CALC_AGENT = ROOT / "examples" / "harness" / "calc_agent.py"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("harness") / "tiny", hidden_size=32,
                                 num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=400)


class RecordingEngine:
    """The run's engine, remembering every (prompt ids, generated ids) it served."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[str | None, list[int], list[int]]] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, prompt_ids: list[int], params: Any, key: str | None = None) -> Any:
        generation = await self.engine.generate(prompt_ids, params, key=key)
        self.calls.append((key, list(prompt_ids), list(generation.token_ids)))
        return generation

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def harness_config(model_dir: Path, harness: dict[str, Any], group_size: int = 1,
                   env: str = "agentrl/Calculator-v0", **sections: Any) -> Any:
    """One harness environment (group_size rollouts per group, one group)."""
    raw: dict[str, Any] = {
        "model": {"path": str(model_dir)},
        "batch": {"rollout_batch_size": 1, "n_samples_per_prompt": group_size,
                  "global_batch_size": group_size},
        "rollout": {"max_new_tokens": 24, "max_turns": 8, "max_rollout_tokens": 200,
                    "step_timeout_s": 10.0},
        "environments": [{"id": env, "name": "agent", "harness": harness,
                          "kwargs": {"max_number": 9}}]}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def collect(config: Any, model_dir: Path, num_rollouts: int | None = None
            ) -> tuple[Any, RecordingEngine, Any]:
    """(collection result, the recording engine, the tokenizer) of one collection."""
    tokenizer = load_tokenizer(model_dir)
    engine = RecordingEngine(build_engines(config, model_dir, tokenizer,
                                           read_args(model_dir).max_position_embeddings))
    runner = build_runner(config, engine, tokenizer, build_sampler(config))
    loop = asyncio.new_event_loop()
    try:
        needed = num_rollouts or config.batch.global_batch_size
        result = loop.run_until_complete(runner.collect(1, needed))
        if runner.endpoint is not None:
            loop.run_until_complete(runner.endpoint.close())
    finally:
        loop.close()
    return result, engine, tokenizer


def assert_rows_hold_what_the_engine_saw(rollout: Any, calls: list) -> None:
    """Every request of the rollout: its prompt ids, then its generated ids (loss mask 1),
    stand at the start of one of the rollout's rows; no other token is trained."""
    mine = [(p, g) for key, p, g in calls if key and split_key(key)[0] == rollout.rollout_id]
    assert mine, "the rollout made no request"
    for prompt, generated in mine:
        end = len(prompt) + len(generated)
        holders = [s for s in rollout.segments if s.token_ids[:end] == prompt + generated
                   and all(s.loss_mask[len(prompt):end])]
        assert holders, "a request's prompt + completion is in no row: drift"
    assert sum(s.num_generated_tokens for s in rollout.segments) == sum(
        len(g) for _, g in mine)

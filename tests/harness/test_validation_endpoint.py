"""Validation beside training: the training endpoint keeps ``endpoint.port`` while a
validation plays its harness rollouts on an endpoint of its own (a free port)."""

from __future__ import annotations

import asyncio
import socket

from agentrl.engines.build import build_engines
from agentrl.model import load_tokenizer, read_args
from agentrl.rollout.build import build_runner, build_sampler
from agentrl.rollout.evaluation import eval_rollouts
from tests.harness.conftest import CALC_AGENT, harness_config


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_validation_beside_a_training_endpoint_on_a_fixed_port(tiny_dir) -> None:
    port = _free_port()
    config = harness_config(tiny_dir, {"run": f"{CALC_AGENT}:run"}, endpoint={"port": port},
                            rollout={"max_turns": 2, "max_new_tokens": 8})
    tokenizer = load_tokenizer(tiny_dir)
    engine = build_engines(config, tiny_dir, tokenizer,
                           read_args(tiny_dir).max_position_embeddings)
    runner = build_runner(config, engine, tokenizer, build_sampler(config))

    async def validate_while_training_listens():
        await runner.endpoint.start()  # the training endpoint holds the fixed port
        try:
            return await eval_rollouts(engine, tokenizer, config, 1)
        finally:
            await runner.endpoint.close()

    [rollout] = asyncio.run(validate_while_training_listens())
    assert runner.endpoint.port == port
    assert rollout.stats.error is None, rollout.stats.error
    assert rollout.stats.num_turns >= 1  # the program reached the validation's endpoint

"""Warm-starting an agent program: ``agentrl sft`` plays a JSONL of trajectories through the
program itself (the scripted engine behind the endpoint answers its n-th request with the
n-th action; the program runs its own ``calculate``), so the demonstration rows have
exactly the layout of the program's RL rollouts. For examples/harness/calc_agent.py, which
sends the environment's own prompt and tool schema, they are token for token the rows of
the same trajectories played by the environment's own loop."""

from __future__ import annotations

import asyncio
import importlib.util

import msgspec
import pytest

from agentrl.config import ConfigError
from agentrl.envs.demonstrations import Trajectory, demonstration_policies
from agentrl.model import load_tokenizer
from agentrl.rollout.demonstrations import play_demonstrations
from tests.harness.conftest import CALC_AGENT, ROOT, harness_config

SCRIPT = ROOT / "examples" / "quickstart" / "calculator_demonstrations.py"
ROLLOUT = {"max_new_tokens": 64, "max_rollout_tokens": 400}


def weak_demonstrations(num: int) -> list[Trajectory]:
    """The quickstart's weak demonstrator's trajectories, named for the harness config."""
    spec = importlib.util.spec_from_file_location("calculator_demonstrations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.trajectories(num, 0.5, {"max_number": 9}, env_name="agent")
    return [msgspec.convert(line, Trajectory) for line in lines]


def play(config, tokenizer, trajectories, num):
    policies = demonstration_policies(config, {"agent": trajectories})
    lines: list[str] = []
    rollouts = asyncio.run(play_demonstrations(config, tokenizer, num, seed=0,
                                               policies=policies, log=lines.append))
    return {r.rollout_id: r for r in rollouts}, "\n".join(lines)


def test_the_program_plays_its_demonstrations_as_its_rl_rollouts_lay_out(tiny_dir):
    tokenizer = load_tokenizer(tiny_dir)
    trajectories = weak_demonstrations(6)
    harness = harness_config(tiny_dir, {"run": f"{CALC_AGENT}:run"}, rollout=ROLLOUT)
    plain = msgspec.structs.replace(harness, environments=[msgspec.structs.replace(
        harness.environments[0], harness=None)])
    through_program, report = play(harness, tokenizer, trajectories, 6)
    through_env, _ = play(plain, tokenizer, trajectories, 6)

    assert "agent: 6 played, 6 correct" in report
    assert sorted(through_program) == sorted(through_env)
    requests = sorted(r.stats.num_turns for r in through_program.values())
    assert requests == sorted(len(t.actions) for t in trajectories)
    assert 1 in requests and 2 in requests  # direct answers and tool calls both played
    for rollout_id, rollout in through_program.items():
        (row,) = rollout.segments  # a tool-calling loop is one row
        (expected,) = through_env[rollout_id].segments
        assert row.token_ids == expected.token_ids
        assert row.loss_mask == expected.loss_mask
        assert rollout.reward == 1.0


def test_a_program_without_trajectories_is_refused_naming_the_fix(tiny_dir):
    config = harness_config(tiny_dir, {"run": f"{CALC_AGENT}:run"})
    with pytest.raises(ConfigError, match=r"agent program .*--demonstrations FILE\.jsonl"):
        demonstration_policies(config)


def test_a_trajectory_shorter_than_the_programs_requests_names_the_missing_turn(tiny_dir):
    tokenizer = load_tokenizer(tiny_dir)
    calls_only = [msgspec.structs.replace(t, actions=t.actions[:1])
                  for t in weak_demonstrations(8) if len(t.actions) == 2][:1]
    config = harness_config(tiny_dir, {"run": f"{CALC_AGENT}:run"}, rollout=ROLLOUT)
    with pytest.raises(ConfigError, match="gave no message for turn 2"):
        play(config, tokenizer, calls_only, 1)

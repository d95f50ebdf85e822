"""The quickstart's weak calculator demonstrator: both habits, every trajectory correct."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrl.envs.registry import make

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / \
    "calculator_demonstrations.py"
KWARGS = {"num_operations": 1, "max_number": 9}


def load_script():
    spec = importlib.util.spec_from_file_location("calculator_demonstrations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_share_uses_the_tool_and_every_trajectory_is_graded_correct():
    lines = load_script().trajectories(40, 0.4, KWARGS)
    tool = [line for line in lines if len(line["actions"]) == 2]
    assert 0 < len(tool) < len(lines)
    env = make("agentrl/Calculator-v0", **KWARGS)
    for line in lines:
        env.reset(seed=line["seed"])
        for action in line["actions"]:
            _, reward, done, _, _ = env.step(action)
        assert done and reward == 1.0, line
    assert all(line["actions"][0].startswith("<tool_call>") for line in tool)
    with pytest.raises(ValueError, match="--tool-share is 1.5"):
        load_script().trajectories(1, 1.5, KWARGS)

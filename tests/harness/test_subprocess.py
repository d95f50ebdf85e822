"""A harness given as a command line: the example agent run as a subprocess with
OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL and AGENTRL_TASK, plain and in the
bubblewrap sandbox (where the endpoint is its only way out)."""

from __future__ import annotations

import site
import sys

import pytest

from agentrl.sandbox import bwrap_problem
from agentrl.sandbox.bwrap import host_uid
from agentrl.sandbox.interpreter import sandbox_interpreter
from tests.harness.conftest import (
    AGENTS,
    CALC_AGENT,
    ROOT,
    SFT,
    assert_rows_hold_what_the_engine_saw,
    collect,
    harness_config,
)


def test_a_subprocess_harness_plays_and_is_graded() -> None:
    config = harness_config(SFT, {"command": [sys.executable, str(CALC_AGENT)]},
                            group_size=4, rollout={"max_new_tokens": 40})
    result, engine, _ = collect(config, SFT)
    assert all(r.valid for r in result.rollouts), [r.stats.error for r in result.rollouts]
    for rollout in result.rollouts:  # graded by the environment's own grade()
        assert rollout.reward == rollout.reward_components["correct"]
        assert len(rollout.segments) == 1 and rollout.stats.num_turns >= 1
        assert_rows_hold_what_the_engine_saw(rollout, engine.calls)


def test_a_failing_or_hanging_command_invalidates_its_rollout(tiny_dir) -> None:
    script = "import sys, time; sys.stderr.write('boom\\n'); sys.exit(3)"
    config = harness_config(tiny_dir, {"command": [sys.executable, "-c", script]})
    with pytest.warns(RuntimeWarning):
        result, _, _ = collect(config, tiny_dir)
    [failed] = result.rollouts
    assert failed.stats.error_kind == "harness_raised"
    assert "exited with status 3: boom" in failed.stats.error
    config = harness_config(tiny_dir, {"command": [sys.executable, "-c",
                                                   "import time; time.sleep(60)"],
                                       "timeout_s": 1.0})
    with pytest.warns(RuntimeWarning):
        result, _, _ = collect(config, tiny_dir)
    assert result.rollouts[0].stats.error_kind == "harness_timeout"


@pytest.mark.skipif(bwrap_problem() is not None, reason="bubblewrap cannot run here")
def test_a_sandboxed_harness_reaches_only_the_endpoint() -> None:
    # an interpreter the sandbox's user may run (the venv's may live under /root), with
    # this environment's packages (openai) on its path
    python = sandbox_interpreter(host_uid()).executable
    packages = ":".join(site.getsitepackages())
    config = harness_config(SFT, {"command": [python, str(AGENTS / "sandbox_probe.py")],
                                  "sandbox": True, "cwd": str(ROOT),
                                  "env": {"PYTHONPATH": packages}},
                            rollout={"max_new_tokens": 40})
    result, engine, _ = collect(config, SFT)
    [rollout] = result.rollouts
    assert rollout.valid, rollout.stats.error
    assert rollout.stats.num_turns >= 1  # it reached the endpoint through its socket
    assert_rows_hold_what_the_engine_saw(rollout, engine.calls)

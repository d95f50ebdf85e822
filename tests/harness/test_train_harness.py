"""Test (a) of the issue: the unmodified example agent (examples/harness/calc_agent.py, a
plain tool-calling loop on the official ``openai`` client that implements the
``calculate`` tool itself) trained on agentrl/Calculator-v0's tasks through the endpoint,
from the quickstart's warm start: the training reward rises over a short CPU run.

Deterministic (``train.deterministic``: batch-invariant decoding, groups in launch order,
a sampling seed per rollout and request), so the run, and this test's outcome, do not
depend on timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "harness" / "calc_agent.toml"
NUM_STEPS = 16
SHORT = ["--set", f"train.num_steps={NUM_STEPS}", "--set", "batch.rollout_batch_size=4",
         "--set", "batch.global_batch_size=16", "--set", "optim.warmup_steps=0",
         "--set", "train.deterministic=true", "--set", "log.rollouts_every=0",
         "--set", "rollout.max_new_tokens=32", "--set", "rollout.max_rollout_tokens=96"]


@pytest.mark.slow
def test_the_unmodified_agent_learns_calculator_tasks(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert main(["train", str(CONFIG), "--out", str(out), *SHORT]) == 0
    steps = read_metrics(out)
    assert len(steps) == NUM_STEPS
    assert all(s["invalid_rate"] == 0.0 for s in steps)  # the program never failed
    assert all(s["rows_per_rollout/mean"] == 1.0 for s in steps)  # its loop: one row
    rewards = [s["env/calc_agent/reward/mean"] for s in steps]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    print(f"reward/mean by step: {[round(r, 3) for r in rewards]}; first 4 {first:.3f}, "
          f"last 4 {last:.3f}")
    assert last > first, rewards

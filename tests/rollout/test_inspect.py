"""``agentrl inspect``: batch files round-trip; the report shows one count per rollout."""

from __future__ import annotations

import pytest

from agentrl.cli import main
from agentrl.rollout.batch_io import load_batch, save_batch
from agentrl.rollout.describe import describe_batch
from agentrl.types import Rollout, RolloutStats, Segment


def segment(num_prompt: int, num_generated: int) -> Segment:
    n = num_prompt + num_generated
    return Segment(list(range(n)), [0] * num_prompt + [1] * num_generated,
                   [0.0] * num_prompt + [-0.5] * num_generated, num_prompt)


def example_batch() -> list[Rollout]:
    """ARCHITECTURE.md's example: g0 reward 1.0 in 4 rows, g1 reward 0.0 in 1 row."""
    long = Rollout("s0-g0-r0", "s0-g0", "kv", [segment(5, 2), segment(4, 2), segment(4, 2),
                                               segment(4, 1)], 1.0,
                   stats=RolloutStats(num_compactions=3))
    short = Rollout("s0-g0-r1", "s0-g0", "kv", [segment(5, 3)], 0.0)
    broken = Rollout("s0-g0-r2", "s0-g0", "kv", [segment(5, 4)], 0.0, valid=False,
                     stats=RolloutStats(error="env.step timed out after 30.0s"))
    return [long, short, broken]


def test_report_counts_each_rollout_once():
    text = describe_batch(example_batch())
    assert "rollout s0-g0-r0 · reward 1 · 4 rows · 7 generated tokens → +0.5" in text
    assert "rollout s0-g0-r1 · reward 0 · 1 row · 3 generated tokens → -0.5" in text
    assert "INVALID (env.step timed out after 30.0s) → masked" in text
    assert text.count("reward copy 1 ·") == 4
    assert "3 rollouts (2 valid) in 6 rows" in text
    assert "divides by 10 generated tokens" in text  # 7 + 3; the invalid rollout's 4 excluded


def test_rloo_report_uses_leave_one_out_baseline():
    text = describe_batch(example_batch(), estimator="rloo")
    assert "→ +1   (baseline 0)" in text and "→ -1   (baseline 1)" in text


def test_batch_round_trips_through_json(tmp_path):
    batch = example_batch()
    path = save_batch(tmp_path / "b" / "batch.json", batch, step=3)
    assert load_batch(path) == batch
    (tmp_path / "bad.json").write_text('{"nope": 1}')
    with pytest.raises(ValueError, match="not a batch"):
        load_batch(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_batch(tmp_path / "missing.json")


def test_cli_inspects_a_saved_batch(tmp_path, capsys):
    path = save_batch(tmp_path / "batch.json", example_batch())
    assert main(["inspect", str(path)]) == 0
    assert "4 rows · 7 generated tokens → +0.5" in capsys.readouterr().out


def test_cli_demo_collects_compacted_rollouts(tmp_path, capsys):
    assert main(["inspect", "--demo", "--save", str(tmp_path / "demo.json")]) == 0
    out = capsys.readouterr().out
    rollouts = load_batch(tmp_path / "demo.json")
    assert len(rollouts) == 8 and any(len(r.segments) > 1 for r in rollouts)
    assert "compactions" in out and "the token-level loss divides by" in out


def test_report_shows_policy_versions_per_row():
    spanning = Rollout("s2-g0-r0", "s2-g0", "kv", [
        Segment([0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -1, -1, 0.0, -1], 2,
                version_runs=[(2, 3), (5, 4)]),
        Segment([0, 1, 2], [0, 1, 1], [0.0, -1, -1], 1, version_runs=[(1, 4)]),
    ], 1.0)
    text = describe_batch([spanning, Rollout("s2-g0-r1", "s2-g0", "kv",
                                             [segment(2, 2)], 0.0)])
    # an in-flight weight update reached the first row mid-turn; the second row is newer
    assert "row 0: 6 tokens (2 prompt, 3 generated)" in text
    assert "on each generated token · policy v3 ×2, v4 ×1" in text
    assert "on each generated token · policy v4 ×2" in text
    assert text.count("· policy") == 2  # unrecorded versions print nothing

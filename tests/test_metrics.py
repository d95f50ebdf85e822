"""Step stats count groups, rollouts, rows and tokens, overall and per environment."""

import json

from agentrl.observe.metrics import step_stats
from tests.factories import rollout


def test_counts_by_hand():
    rollouts = [
        rollout("a", "G1", 1.0, num_rows=3, env="x", num_generated=2),   # 6 tokens
        rollout("b", "G1", 0.0, num_rows=1, env="x", num_generated=4),   # 4 tokens
        rollout("c", "G2", 1.0, env="y", num_generated=5),
        rollout("d", "G2", 1.0, env="y", num_generated=5, valid=False),
    ]
    stats = step_stats(7, rollouts)
    flat = stats.to_flat_dict()
    assert flat["step"] == 7
    assert (flat["num_groups"], flat["num_rollouts"], flat["num_rows"]) == (2, 4, 6)
    assert flat["num_sampled_tokens"] == 20
    assert flat["num_trainable_tokens"] == 15
    assert flat["num_uniform_groups"] == 1  # G2: only c is valid → no signal
    assert flat["mixed_group_fraction"] == 0.5
    assert flat["env/x/num_rollouts"] == 2 and flat["env/y/num_rows"] == 2
    assert flat["env/x/reward/mean"] == 0.5
    assert flat["env/y/num_invalid_rollouts"] == 1
    assert json.loads(stats.to_json_line())["num_rows"] == 6


def test_rows_per_rollout_and_tool_errors_by_kind_per_environment():
    from agentrl.observe.metrics import rollout_figures
    from agentrl.types import RolloutStats

    a = rollout("a", "G1", 1.0, num_rows=3, env="x")
    a.stats = RolloutStats(tool_errors={"malformed_json": 2, "timeout": 1})
    b = rollout("b", "G1", 0.0, num_rows=1, env="x")
    b.stats = RolloutStats(tool_errors={"malformed_json": 1})
    c = rollout("c", "G2", 1.0, num_rows=2, env="y")
    overall = rollout_figures([a, b, c])
    assert overall["rows_per_rollout/mean"] == 2.0  # (3 + 1 + 2) / 3
    assert overall["tool_errors/malformed_json"] == 3.0 and overall["tool_errors/timeout"] == 1.0
    assert overall["tool_errors"] == 4.0  # the existing total stays
    x = rollout_figures([a, b], "env/x/")
    assert x["env/x/rows_per_rollout/mean"] == 2.0 and x["env/x/tool_errors/timeout"] == 1.0
    y = rollout_figures([c], "env/y/")
    assert y["env/y/rows_per_rollout/mean"] == 2.0
    assert not any("/tool_errors/" in key for key in y)  # no kind occurred: nothing logged


def test_compaction_efficacy_figures_by_hand():
    """Three rollouts: one compacted by tool then budget (kept 1 of 1, then 1 of 2 facts),
    one by budget with drop_oldest (kept 0 of 1), one never compacted."""
    from agentrl.observe.compaction import compaction_figures
    from agentrl.types import Compaction, RolloutStats
    from tests.factories import rollout

    a, b, c = (rollout("a", "g", 1.0, num_rows=3), rollout("b", "g", 0.0, num_rows=2),
               rollout("c", "g", 0.5))
    a.stats = RolloutStats(num_compactions=2, compactions=[
        Compaction("tool", "tool", 0, "Entry: x.", 8, ["x"], ["x"]),
        Compaction("budget", "summarize", 1, "Entry: x.", 6, ["x", "y"], ["x"])])
    b.stats = RolloutStats(num_compactions=1, compactions=[
        Compaction("budget", "drop_oldest", 0, None, 0, ["x"], [])])
    figures = compaction_figures([a, b, c], prefix="env/e/")
    assert figures == {
        "env/e/compaction/by_tool/mean": 1 / 3,
        "env/e/compaction/by_budget/mean": 2 / 3,
        "env/e/compaction/compacted_share": 2 / 3,
        "env/e/compaction/summary_tokens/mean": 7.0,  # drop_oldest has no summary
        "env/e/compaction/fact_survival": 2 / 4,
        "env/e/reward/compacted": 0.5,
        "env/e/reward/not_compacted": 0.5,
    }
    assert "compaction/fact_survival" not in compaction_figures([c])

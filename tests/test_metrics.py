"""Step stats count groups, rollouts, rows and tokens, overall and per environment."""

import json

from agentrl.metrics import step_stats
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

"""The one guard of a rollout's reward and the one rule of per-id sampling seeds, which
the multi-turn runner, agent programs and subagent threads share."""

from __future__ import annotations

import math

from agentrl.rollout.env_contract import scaled_reward
from agentrl.rollout.seeds import derived_seed


def test_a_non_finite_scaled_reward_is_a_named_bad_reward_of_zero():
    assert scaled_reward("e", 0.5, 2.0) == (1.0, None)
    for reward, scale in ((1e308, 10.0), (1.0, math.nan), (math.inf, 1.0)):
        value, error = scaled_reward("e", reward, scale)
        assert value == 0.0 and error.kind == "bad_reward"
        assert "env 'e'" in str(error) and "expected a finite float" in str(error)


def test_a_seed_is_fixed_by_its_seed_and_id_only():
    assert derived_seed(7, "g-r0") == derived_seed(7, "g-r0")
    seeds = {derived_seed(s, i) for s in range(3) for i in ("g-r0", "g-r1", "1", "2.1")}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)

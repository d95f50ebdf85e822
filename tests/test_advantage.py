"""Advantages: one reward per rollout, baselines within groups, broadcast to rows."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.advantage import compute_advantages, rollout_advantages
from agentrl.reassembler import RewardMismatchError, rollout_validity, to_rows
from tests.factories import rollout


def test_the_motivating_case_counts_each_rollout_once():
    # g0: reward 1.0 split into 4 rows; g1: reward 0.0 in 1 row. Mean baseline 0.5.
    rows = to_rows([rollout("g0", "G", 1.0, num_rows=4), rollout("g1", "G", 0.0, num_rows=1)])
    assert compute_advantages(rows) == [0.5, 0.5, 0.5, 0.5, -0.5]
    # Counting rows would have given a baseline of 4/5 = 0.8: +0.2 / -0.8.
    assert compute_advantages(rows) != [0.2, 0.2, 0.2, 0.2, -0.8]


def test_rloo_on_a_small_group_by_hand():
    rows = to_rows([rollout("a", "G", 1.0), rollout("b", "G", 0.0), rollout("c", "G", 0.5)])
    # leave-one-out means: a: (0+0.5)/2=0.25, b: (1+0.5)/2=0.75, c: (1+0)/2=0.5
    assert compute_advantages(rows, "rloo") == pytest.approx([0.75, -0.75, 0.0])


def test_grpo_std_scaling_by_hand():
    rows = to_rows([rollout("a", "G", 1.0), rollout("b", "G", 0.0)])
    # mean 0.5, sample std (ddof=1) sqrt(0.5) = 0.70711 → ±0.5 / (0.70711 + 1e-6) = ±0.70711;
    # the population std (0.5) would give ±1.0, 41% larger at group size 2
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert compute_advantages(rows, "grpo", scale_by_std=True) == pytest.approx(
        [expected, -expected], abs=1e-12)
    assert abs(expected - 0.70711) < 1e-5


def test_grpo_std_scaling_at_group_size_eight_uses_the_sample_std():
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    rows = to_rows([rollout(f"r{i}", "G", r) for i, r in enumerate(rewards)])
    # mean 3/8; sum of squared deviations 3·(5/8)² + 5·(3/8)² = 1.875; ddof=1: /7
    sample_std = math.sqrt(1.875 / 7)
    assert compute_advantages(rows, "grpo", scale_by_std=True)[0] == pytest.approx(
        (5 / 8) / (sample_std + 1e-6), abs=1e-12)


def test_grpo_std_scaling_of_a_group_of_one_is_zero():
    rows = to_rows([rollout("a", "G", 1.0), rollout("b", "H", 0.0), rollout("c", "H", 1.0)])
    assert compute_advantages(rows, "grpo", scale_by_std=True)[0] == 0.0


def test_dr_grpo_never_scales_and_refuses_std():
    rows = to_rows([rollout("a", "G", 3.0), rollout("b", "G", 1.0)])
    assert compute_advantages(rows, "dr_grpo") == [1.0, -1.0]
    with pytest.raises(ValueError, match="dr_grpo never divides"):
        compute_advantages(rows, "dr_grpo", scale_by_std=True)


def test_uniform_group_gives_zero_and_groups_never_mix():
    rows = to_rows([
        rollout("a", "A", 5.0, env="x"), rollout("b", "A", 5.0, env="x"),
        rollout("c", "B", 1.0, env="y"), rollout("d", "B", 0.0, env="y"),
    ])
    # Group A's large reward offset never enters group B's baseline.
    assert compute_advantages(rows) == [0.0, 0.0, 0.5, -0.5]


def test_one_bad_row_masks_the_whole_rollout():
    bad = rollout("a", "G", 1.0, num_rows=3)
    rows = to_rows([bad, rollout("b", "G", 0.0), rollout("c", "G", 1.0)])
    rows[1].valid = False  # one row of rollout a failed
    assert rollout_validity(rows) == {"a": False, "b": True, "c": True}
    advantages = compute_advantages(rows)
    assert advantages[:3] == [0.0, 0.0, 0.0]
    assert advantages[3:] == [-0.5, 0.5]  # baseline over b and c only


def test_changed_copy_raises_naming_the_rollout():
    rows = to_rows([rollout("g0", "G", 1.0, num_rows=2), rollout("g1", "G", 0.0)])
    rows[1].reward = 0.9
    with pytest.raises(RewardMismatchError, match=r"'g0'.*\[0\.9, 1\.0\]"):
        compute_advantages(rows)


def test_rollout_in_two_groups_is_refused():
    rows = to_rows([rollout("a", "G", 1.0, num_rows=2)])
    rows[1].group_id = "H"
    with pytest.raises(ValueError, match="belongs to exactly one group"):
        compute_advantages(rows)


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages(to_rows([rollout("a", "G", 1.0)]), "ppo")


# ------------------------------------------------------------------ properties

group_rewards = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]), min_size=1, max_size=6)
groups_strategy = st.lists(group_rewards, min_size=1, max_size=4)


def _rollouts(groups, splits, valid=None):
    out, k = [], 0
    for g, rewards in enumerate(groups):
        for j, reward in enumerate(rewards):
            ok = True if valid is None else valid[k % len(valid)]
            out.append(rollout(f"g{g}r{j}", f"g{g}", reward, num_rows=splits[k % len(splits)],
                               valid=ok))
            k += 1
    return out


@given(groups_strategy, st.lists(st.integers(1, 5), min_size=1, max_size=8), st.randoms(),
       st.sampled_from(["grpo", "rloo", "dr_grpo"]))
def test_advantages_ignore_row_splits_and_order(groups, splits, rnd, estimator):
    one_row = to_rows(_rollouts(groups, [1]))
    split = to_rows(_rollouts(groups, splits))
    rnd.shuffle(split)
    base = {r.rollout_id: a for r, a in zip(
        one_row, compute_advantages(one_row, estimator), strict=True)}
    for row, adv in zip(split, compute_advantages(split, estimator), strict=True):
        assert math.isclose(adv, base[row.rollout_id], abs_tol=1e-12)


@given(groups_strategy, st.lists(st.integers(1, 4), min_size=1, max_size=8), st.data())
def test_changing_any_one_copy_raises(groups, splits, data):
    rows = to_rows(_rollouts(groups, splits))
    index = data.draw(st.integers(0, len(rows) - 1))
    rows[index].reward += data.draw(st.sampled_from([0.1, -1.0, 1e-9]))
    # A rollout with a single row has nothing to disagree with; otherwise it must raise.
    if sum(r.rollout_id == rows[index].rollout_id for r in rows) > 1:
        with pytest.raises(RewardMismatchError, match=rows[index].rollout_id):
            compute_advantages(rows)


@given(groups_strategy, st.lists(st.booleans(), min_size=1, max_size=8),
       st.floats(-100, 100), st.sampled_from(["grpo", "rloo", "dr_grpo"]))
def test_invalid_rollouts_never_move_a_baseline(groups, valid, junk, estimator):
    rollouts = _rollouts(groups, [1, 2], valid)
    clean = rollout_advantages(to_rows(rollouts), estimator)
    for r in rollouts:
        if not r.valid:
            r.reward = junk  # whatever an invalid rollout claims must not matter
    dirty = rollout_advantages(to_rows(rollouts), estimator)
    for rid, result in clean.items():
        assert math.isclose(dirty[rid].advantage, result.advantage, abs_tol=1e-9)
        if not result.valid:
            assert result.advantage == 0.0

"""Policy versions on the data: run-length records, ages, staleness figures, the bound
rule, and the invariants of the architecture holding under asynchronous collection."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.advantage import compute_advantages
from agentrl.packing import collate
from agentrl.reassembler import check_reward_copies, to_rows
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.staleness import (
    StalenessError,
    asynchronous_figures,
    check_bound,
    extend_runs,
    segment_ages,
    staleness_figures,
    token_versions,
)
from agentrl.types import Group, Rollout, Segment


def test_runs_open_only_where_the_version_changes() -> None:
    runs: list[tuple[int, int]] = []
    extend_runs(runs, 3, [0, 0, 1])
    extend_runs(runs, 8, [1, 1, 2])
    assert runs == [(3, 0), (5, 1), (10, 2)]
    assert token_versions(runs, 12, default=7).tolist() == [7, 7, 7, 0, 0, 1, 1, 1, 1, 1, 2, 2]
    assert token_versions([], 3, default=4).tolist() == [4, 4, 4]


def test_segment_builder_records_versions_across_observations() -> None:
    builder = SegmentBuilder([1, 2, 3])
    builder.add_generated([10, 11, 12], [-0.1] * 3, [4, 4, 5])
    builder.add_observation([20, 21])
    builder.add_generated([13], [-0.2], [5])  # same version: the run continues
    segment = builder.build()
    assert segment.version_runs == [(3, 4), (5, 5)]
    # trained version 5: tokens 10, 11 are one step old, 12 and 13 fresh
    assert segment_ages(segment, 5) == {1: 2, 0: 2}
    with pytest.raises(ValueError, match="1 versions"):
        builder.add_generated([14, 15], [-0.1, -0.1], [5])


def _segment(versions: list[int], num_prompt: int = 2) -> Segment:
    builder = SegmentBuilder(list(range(num_prompt)))
    builder.add_generated([7] * len(versions), [-0.5] * len(versions), versions)
    return builder.build()


def _rollout(rid: str, env: str, *segments: Segment, valid: bool = True,
             reward: float = 1.0) -> Rollout:
    return Rollout(rid, rid.split("-")[0], env, list(segments), reward, valid)


def test_staleness_figures_by_hand() -> None:
    rollouts = [
        _rollout("a-0", "x", _segment([3, 3, 4])),         # ages at version 4: 1, 1, 0
        _rollout("a-1", "x", _segment([4]), _segment([4])),  # 0, 0 (two rows)
        _rollout("b-0", "y", _segment([2, 2, 2, 2, 2])),   # 2 × 5
        _rollout("b-1", "y", _segment([1] * 9), valid=False),  # not trained: not counted
    ]
    figures = staleness_figures(rollouts, trained_version=4)
    assert figures["staleness/mean"] == pytest.approx((1 + 1 + 10) / 10)
    assert figures["staleness/max"] == 2.0
    assert figures["staleness/age_0_share"] == pytest.approx(3 / 10)
    assert figures["staleness/age_1_share"] == pytest.approx(2 / 10)
    assert figures["staleness/age_2_share"] == pytest.approx(5 / 10)
    assert "staleness/age_3_share" not in figures
    per_env = staleness_figures(rollouts[:2], 4, "env/x/")
    assert per_env["env/x/staleness/mean"] == pytest.approx(2 / 5)
    assert staleness_figures([], 4) == {}


def test_a_token_past_the_bound_stops_the_step_and_nothing_is_dropped() -> None:
    fresh = Group("g0", "x", [_rollout("g0-0", "x", _segment([4])),
                              _rollout("g0-1", "x", _segment([3]))])
    # one rollout of g1 has a token from version 2: age 2 at trained version 4
    old = Group("g1", "y", [_rollout("g1-0", "y", _segment([3])),
                            _rollout("g1-1", "y", _segment([4]), _segment([2, 4]))])
    unrecorded = Group("g2", "y", [_rollout("g2-0", "y", Segment([1, 2], [0, 1], [0, -1], 1))])
    with pytest.raises(StalenessError, match=r"rollout g1-1 \(env 'y'\) has a token of "
                                             "version 2, trained at version 4"):
        check_bound([fresh, old, unrecorded], trained_version=4, max_staleness=1)
    check_bound([fresh, old, unrecorded], 4, max_staleness=2)  # within it: nothing happens
    assert asynchronous_figures(0.5) == {"time/engine_idle": 0.5}


def test_collate_expands_versions_into_per_target_ages() -> None:
    # row 0: prompt [0, 1], generated at 2, 3 (version 3) and 4 (version 4)
    # row 1: prompt [0, 1, 2], generated at 3 (version 2)
    rows = to_rows([_rollout("a-0", "x", _segment([3, 3, 4])),
                    _rollout("a-1", "x", _segment([2], num_prompt=3))])
    mb = collate(rows, [0.5, -0.5], [0, 1], trained_version=4)
    # position t predicts token t+1: targets of row 0 are tokens 1..4, row 1 tokens 1..3
    # (each row's last token predicts nothing and is left out)
    assert mb.loss_mask[0].tolist() == [0, 1, 1, 1, 0, 0, 1]
    assert mb.ages[0].tolist() == [0, 1, 1, 0, 0, 0, 2]
    assert collate(rows, [0.5, -0.5], [0, 1]).ages is None
    assert collate(rows, [0.5, -0.5], [], trained_version=4).ages.tolist() == [[0]]


# ------------------------------------------------------------------ invariants under k >= 1

rollout_shape = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0]),                      # reward
    st.booleans(),                                         # valid
    st.lists(st.integers(1, 4), min_size=1, max_size=4),   # generated tokens per row
)
groups_strategy = st.lists(st.lists(rollout_shape, min_size=1, max_size=4), min_size=1,
                           max_size=4)


def _async_rollouts(groups, staleness: int, trained: int, draw) -> list[Group]:
    """Rollouts as asynchronous collection with compaction and in-flight updates makes
    them: several rows each, versions rising through the rollout, none older than k."""
    out = []
    for g, members in enumerate(groups):
        rollouts = []
        for j, (reward, valid, lengths) in enumerate(members):
            version = trained - draw(st.integers(0, staleness))
            segments = []
            for length in lengths:
                versions = []
                for _ in range(length):
                    version = min(trained, version + draw(st.integers(0, 1)))
                    versions.append(version)
                segments.append(_segment(versions))
            rollouts.append(Rollout(f"g{g}-r{j}", f"g{g}", "x", segments, reward, valid))
        out.append(Group(f"g{g}", "x", rollouts))
    return out


@given(groups_strategy, st.integers(1, 3), st.data())
def test_rollouts_count_once_whatever_their_versions(groups, staleness, data):
    trained = 10
    kept = _async_rollouts(groups, staleness, trained, data.draw)
    check_bound(kept, trained, staleness)  # every token is within the bound
    rollouts = [r for g in kept for r in g.rollouts]
    rows = to_rows(rollouts)
    # one reward copy per rollout on every row, one advantage per rollout: the same as
    # when each rollout is a single row without versions
    assert check_reward_copies(rows) == {r.rollout_id: r.reward for r in rollouts}
    plain = [Rollout(r.rollout_id, r.group_id, r.env, [_segment([0])], r.reward, r.valid)
             for r in rollouts]
    expected = dict(zip([r.rollout_id for r in plain],
                        compute_advantages(to_rows(plain)), strict=True))
    for row, advantage in zip(rows, compute_advantages(rows), strict=True):
        assert math.isclose(advantage, expected[row.rollout_id], abs_tol=1e-12)
    # the token normalizer counts generated tokens of valid rollouts, never rows
    mb = collate(rows, compute_advantages(rows), list(range(len(rows))), trained)
    assert mb.num_tokens == sum(r.num_generated_tokens for r in rollouts if r.trainable)
    ages = mb.ages[mb.loss_mask > 0].tolist()
    assert all(0 <= age <= staleness for age in ages)


@given(groups_strategy, st.data())
def test_a_tighter_bound_is_checked_never_enforced_by_dropping(groups, data):
    trained = 10
    all_groups = _async_rollouts(groups, 3, trained, data.draw)
    before = [[r.rollout_id for r in g.rollouts] for g in all_groups]
    too_old = any(v < trained - 1 for g in all_groups for r in g.rollouts
                  for s in r.segments for _, v in s.version_runs)
    if too_old:
        with pytest.raises(StalenessError, match="older than rollout.max_staleness = 1"):
            check_bound(all_groups, trained, max_staleness=1)
    else:
        check_bound(all_groups, trained, max_staleness=1)
    assert [[r.rollout_id for r in g.rollouts] for g in all_groups] == before

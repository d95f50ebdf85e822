"""A rollout without rows (an agent program that answered without asking the model, or an
environment whose constructor raised) still counts: in its group's baseline with its one
reward, in dynamic sampling, and in the updates, which are dealt by rollout whatever
their rows (invariants 1 and 7)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.advantage import compute_advantages, rollout_advantages
from agentrl.observe.metrics import drop_reason
from agentrl.reassembler import to_rows
from agentrl.train.trainer import split_by_rollout
from agentrl.types import Group
from tests.factories import rollout


def test_a_rowless_valid_rollout_counts_in_its_group_baseline() -> None:
    rollouts = [rollout("r0", "G", 1.0, num_rows=0), *(rollout(f"r{i}", "G", 0.0)
                                                      for i in (1, 2, 3))]
    rows = to_rows(rollouts)
    assert len(rows) == 3
    # mean baseline over the four rollouts: 0.25; the row-less one has no token to train
    assert compute_advantages(rows, rollouts=rollouts) == [-0.25, -0.25, -0.25]
    per_rollout = rollout_advantages(rows, rollouts=rollouts)
    assert per_rollout["r0"].advantage == 0.75 and per_rollout["r0"].baseline == 0.25
    # dynamic sampling sees the same group: it carries signal
    assert drop_reason(Group("G", "e", rollouts)) is None


def test_a_rowless_invalid_rollout_stays_out_of_the_baseline() -> None:
    rollouts = [rollout("r0", "G", 5.0, num_rows=0, valid=False), rollout("r1", "G", 1.0),
                rollout("r2", "G", 0.0)]
    per_rollout = rollout_advantages(to_rows(rollouts), rollouts=rollouts)
    assert not per_rollout["r0"].valid and per_rollout["r0"].advantage == 0.0
    assert per_rollout["r1"].advantage == 0.5 and per_rollout["r2"].advantage == -0.5


def _owners(rows, chunks) -> list[set[str]]:
    return [{rows[i].rollout_id for i in chunk} for chunk in chunks]


def test_updates_are_dealt_by_rollout_whatever_their_rows() -> None:
    rollouts = [rollout("r0", "G", 1.0, num_rows=0), *(rollout(f"r{i}", "G", 0.0)
                                                      for i in (1, 2, 3))]
    rows = to_rows(rollouts)
    chunks = split_by_rollout(rows, 2, [r.rollout_id for r in rollouts])
    # two rollouts per update: r0 (no rows) and r1, then r2 and r3
    assert _owners(rows, chunks) == [{"r1"}, {"r2", "r3"}]


def test_an_invalid_rowless_rollout_shifts_no_later_rollout() -> None:
    rollouts = [rollout("r0", "G", 1.0), rollout("r1", "G", 0.0, num_rows=0, valid=False),
                rollout("r2", "G", 0.0), rollout("r3", "G", 1.0)]
    rows = to_rows(rollouts)
    chunks = split_by_rollout(rows, 2, [r.rollout_id for r in rollouts])
    assert _owners(rows, chunks) == [{"r0"}, {"r2", "r3"}]


group_sizes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(group_sizes, st.data(), st.sampled_from(["grpo", "rloo", "dr_grpo"]))
def test_rows_never_change_how_much_a_rollout_counts(sizes, data, estimator) -> None:
    """Invariants 1-4 with row-less rollouts: every rollout's advantage is the one it has
    when each rollout is a single row, and each update gets an equal share of rollouts."""
    rollouts, single = [], []
    for g, size in enumerate(sizes):
        for j in range(size):
            reward = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
            valid = data.draw(st.booleans())
            num_rows = data.draw(st.integers(0, 3))
            rollouts.append(rollout(f"g{g}r{j}", f"g{g}", reward, num_rows, valid=valid))
            single.append(rollout(f"g{g}r{j}", f"g{g}", reward, 1, valid=valid))
    reference = rollout_advantages(to_rows(single), estimator)
    rows = to_rows(rollouts)
    got = rollout_advantages(rows, estimator, rollouts=rollouts)
    assert got.keys() == reference.keys()
    for rid, expected in reference.items():
        assert got[rid].valid == expected.valid
        assert math.isclose(got[rid].advantage, expected.advantage, abs_tol=1e-12)
    for row, advantage in zip(rows, compute_advantages(rows, estimator, rollouts=rollouts),
                              strict=True):
        assert advantage == got[row.rollout_id].advantage
    num_updates = data.draw(st.integers(1, len(rollouts)))
    ids = [r.rollout_id for r in rollouts]
    chunks = split_by_rollout(rows, num_updates, ids)
    reference_chunks = split_by_rollout(to_rows(single), num_updates, ids)
    # the same rollouts in the same update as if each had exactly one row
    assert _owners(rows, chunks) == [
        {rid for rid in owned if any(r.rollout_id == rid for r in rows)}
        for owned in _owners(to_rows(single), reference_chunks)]
    for chunk in chunks:
        assert chunk == sorted(chunk)


@pytest.mark.parametrize("num_updates", [1, 2, 4])
def test_rows_alone_still_split_as_before(num_updates) -> None:
    rows = to_rows([rollout(f"r{i}", "G", float(i % 2), num_rows=1 + i % 3) for i in range(8)])
    assert [len(o) for o in _owners(rows, split_by_rollout(rows, num_updates))] == [
        8 // num_updates] * num_updates


def test_an_update_of_rowless_rollouts_is_one_empty_micro_batch_per_rank() -> None:
    from types import SimpleNamespace

    from agentrl.packing import CostModel
    from agentrl.train.trainer import micro_batches

    run = SimpleNamespace(plan=SimpleNamespace(num_updates=2), share_prefixes=False,
                          config=SimpleNamespace(batch=SimpleNamespace(
                              max_tokens_per_microbatch=64)),
                          world_size=1, rank=0, cost=CostModel(1.0, 0.0),
                          state=SimpleNamespace(step=0), token_multiple=1)
    rollouts = [rollout("r0", "G", 1.0, num_rows=0), rollout("r1", "G", 0.0, num_rows=0),
                rollout("r2", "G", 0.0, num_rows=2), rollout("r3", "G", 0.0)]
    rows = to_rows(rollouts)
    advantages = compute_advantages(rows, rollouts=rollouts)
    first, second = micro_batches(run, rows, advantages, [r.rollout_id for r in rollouts])
    assert [mb.num_rows for mb in first] == [0] and first[0].num_tokens == 0
    assert sum(mb.num_rows for mb in second) == 3
    assert advantages == [-0.25] * 3

"""Invariants 1-4 and 9 over rollout trees: subagent threads are rows of the one rollout.

Random trees (a main thread and subagent threads, each cut into rows by compaction) ×
staleness k ∈ {0, 1, 2} (tokens of any thread up to k versions old): one reward copy per
rollout, one advantage per rollout on every row of every thread, each rollout counted
once in its group, a bad row in any thread masking the whole rollout, token weights
independent of how threads and rows are packed, and the update equal to training the same
tokens laid out as one flat rollout per thread with the shared advantage. Plus the
hand-worked case of the issue and the update split (the knobs count rollouts).
"""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.advantage import compute_advantages, rollout_advantages
from agentrl.packing import collate, pack
from agentrl.reassembler import (
    RewardMismatchError,
    check_reward_copies,
    rollout_validity,
    to_rows,
)
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.staleness import StalenessError, check_bound
from agentrl.train.trainer import split_by_rollout
from agentrl.types import MAIN_THREAD, Group, Rollout, Segment, Thread
from tests.test_update import VOCAB, gradient, make_model

TRAINED = 10
"""The policy version being trained."""


def _segment(num_generated: int, versions: list[int], seed: int, thread: str) -> Segment:
    """A row: a prompt, generated tokens (with versions) and an observation between."""
    builder = SegmentBuilder([(seed * 7 + i) % VOCAB for i in range(3)])
    half = max(1, num_generated // 2)
    ids = [(seed * 13 + i) % VOCAB for i in range(num_generated)]
    logprobs = [-0.3 - 0.1 * (i % 5) for i in range(num_generated)]
    builder.add_generated(ids[:half], logprobs[:half], versions[:half])
    builder.add_observation([(seed + 5) % VOCAB, (seed + 6) % VOCAB])
    builder.add_generated(ids[half:], logprobs[half:], versions[half:])
    segment = builder.build()
    segment.thread = thread
    return segment


thread_shape = st.lists(st.integers(1, 4), min_size=1, max_size=3)
"""Generated tokens of each row of one thread (compaction made 1-3 rows)."""
tree_shape = st.tuples(
    thread_shape,                                             # the main thread's rows
    st.lists(st.tuples(st.integers(0, 2), thread_shape), max_size=3),  # subagents: parent, rows
    st.sampled_from([0.0, 0.5, 1.0]),                         # reward
    st.booleans(),                                            # valid
)
groups_of_trees = st.lists(st.lists(tree_shape, min_size=1, max_size=3), min_size=1,
                           max_size=3)


def build_groups(groups: list, staleness: int, draw) -> list[Group]:
    """Trees as the runner makes them: main rows first, then each thread's, every token
    with a version within ``staleness`` of ``TRAINED``."""
    out = []
    for g, members in enumerate(groups):
        rollouts = []
        for j, (main_rows, subagents, reward, valid) in enumerate(members):
            threads, layout = [], [(MAIN_THREAD, main_rows)]
            for k, (parent, rows) in enumerate(subagents, start=1):
                parent_id = MAIN_THREAD if parent == 0 or parent >= k else str(parent)
                depth = 1 if parent_id == MAIN_THREAD else 2
                thread_id = str(k) if depth == 1 else f"{parent_id}.{k}"
                threads.append(Thread(thread_id, parent_id, depth, f"ask({k})"))
                layout.append((thread_id, rows))
            segments = []
            for thread_id, rows in layout:
                for r, length in enumerate(rows):
                    versions = [TRAINED - draw(st.integers(0, staleness)) for _ in range(length)]
                    segments.append(_segment(length, versions, g * 100 + j * 10 + r, thread_id))
            rollouts.append(Rollout(f"g{g}-r{j}", f"g{g}", "x", segments, reward, valid,
                                    threads=threads))
        out.append(Group(f"g{g}", "x", rollouts))
    return out


def flat(rollout: Rollout) -> list[Rollout]:
    """The same tokens as one single-thread rollout per thread (same reward and group)."""
    by_thread: dict[str, list[Segment]] = {}
    for segment in rollout.segments:
        by_thread.setdefault(segment.thread, []).append(
            msgspec.structs.replace(segment, thread=MAIN_THREAD))
    return [Rollout(f"{rollout.rollout_id}/{thread}", rollout.group_id, rollout.env, segments,
                    rollout.reward, rollout.valid) for thread, segments in by_thread.items()]


@settings(max_examples=60, deadline=None)
@given(groups_of_trees, st.sampled_from([0, 1, 2]), st.data())
def test_one_reward_one_advantage_each_rollout_once_under_staleness(groups, k, data) -> None:
    kept = build_groups(groups, k, data.draw)
    check_bound(kept, TRAINED, k)  # every token of every thread is within the bound
    rollouts = [r for g in kept for r in g.rollouts]
    rows = to_rows(rollouts)
    assert len(rows) == sum(len(r.segments) for r in rollouts)
    assert check_reward_copies(rows) == {r.rollout_id: r.reward for r in rollouts}
    # the baseline sees each rollout once: the same advantages as one row per rollout
    single = [Rollout(r.rollout_id, r.group_id, r.env, [_segment(1, [TRAINED], 0, "main")],
                      r.reward, r.valid) for r in rollouts]
    expected = {a.rollout_id: a.advantage for a in rollout_advantages(to_rows(single)).values()}
    advantages = compute_advantages(rows)
    for row, advantage in zip(rows, advantages, strict=True):
        assert math.isclose(advantage, expected[row.rollout_id], abs_tol=1e-12)
        assert row.valid == next(r.valid for r in rollouts if r.rollout_id == row.rollout_id)
    # 1/N: N counts generated tokens of valid rollouts over every thread, never rows
    mb = collate(rows, advantages, list(range(len(rows))), TRAINED)
    assert mb.num_tokens == sum(r.num_generated_tokens for r in rollouts if r.trainable)
    assert all(0 <= age <= k for age in mb.ages[mb.loss_mask > 0].tolist())
    # one flat rollout per thread, given the shared advantage, is the same token data
    flat_rows = [row for r in rollouts for row in to_rows(flat(r))]
    flat_adv = [expected[row.rollout_id.split("/")[0]] for row in flat_rows]
    other = collate(flat_rows, flat_adv, list(range(len(flat_rows))), TRAINED)
    for name in ("input_ids", "loss_mask", "advantages", "old_logprobs", "ages"):
        assert torch.equal(getattr(mb, name), getattr(other, name)), name
    assert mb.num_tokens == other.num_tokens


@settings(max_examples=40, deadline=None)
@given(groups_of_trees, st.sampled_from([0, 1, 2]), st.data())
def test_the_bound_sees_the_oldest_token_of_any_thread(groups, k, data) -> None:
    built = build_groups(groups, k, data.draw)
    group = data.draw(st.sampled_from(built))
    victim = data.draw(st.sampled_from(group.rollouts))
    segment = data.draw(st.sampled_from(victim.segments))  # main or any subagent thread
    start, _ = segment.version_runs[-1]
    segment.version_runs = [*segment.version_runs[:-1], (start, TRAINED - k - 1)]
    with pytest.raises(StalenessError, match=f"rollout {victim.rollout_id} "):
        check_bound(built, TRAINED, k)  # named, never dropped


@settings(max_examples=40, deadline=None)
@given(groups_of_trees, st.data())
def test_one_bad_row_or_copy_in_any_thread_is_caught(groups, data) -> None:
    rollouts = [r for g in build_groups(groups, 0, data.draw) for r in g.rollouts]
    victim = data.draw(st.sampled_from(rollouts))
    index = data.draw(st.integers(0, len(victim.segments) - 1))
    rows = to_rows(rollouts)
    mine = [i for i, row in enumerate(rows) if row.rollout_id == victim.rollout_id]
    rows[mine[min(index, len(mine) - 1)]].valid = False  # a row of some thread failed
    assert not rollout_validity(rows)[victim.rollout_id]
    for row, advantage in zip(rows, compute_advantages(rows), strict=True):
        if row.rollout_id == victim.rollout_id:
            assert advantage == 0.0
    mine = [i for i, row in enumerate(rows) if row.rollout_id == victim.rollout_id]
    if len(mine) > 1:
        rows[data.draw(st.sampled_from(mine))].reward += 1.0
        with pytest.raises(RewardMismatchError, match=victim.rollout_id):
            check_reward_copies(rows)


@settings(max_examples=25, deadline=None)
@given(groups_of_trees, st.integers(1, 4), st.data())
def test_updates_get_whole_rollouts_with_every_thread(groups, num_updates, data) -> None:
    """The four knobs count rollouts: each update gets an equal share of rollouts, each
    with all its threads' rows, however many rows the trees have."""
    rollouts = [r for g in build_groups(groups, 0, data.draw) for r in g.rollouts]
    rows = to_rows(rollouts)
    chunks = split_by_rollout(rows, num_updates)
    owners = [{rows[i].rollout_id for i in chunk} for chunk in chunks]
    sizes = [len(o) for o in owners]
    assert sum(sizes) == len(rollouts) and max(sizes) - min(sizes) <= 1
    for chunk, owned in zip(chunks, owners, strict=True):
        assert sorted(chunk) == [i for i, row in enumerate(rows) if row.rollout_id in owned]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return make_model()


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups_of_trees, st.sampled_from([0, 1, 2]), st.randoms(use_true_random=False),
       st.data())
def test_the_gradient_ignores_packing_and_equals_flat_threads(model, groups, k, rnd,
                                                              data) -> None:
    rollouts = [r for g in build_groups(groups, k, data.draw) for r in g.rollouts]
    rows = to_rows(rollouts)
    advantages = compute_advantages(rows)
    if not any(a and r.valid for a, r in zip(advantages, rows, strict=True)):
        return  # nothing trains: every gradient is zero
    one = [collate(rows, advantages, list(range(len(rows))), TRAINED)]
    reference = gradient(model, one)
    order = list(range(len(rows)))
    rnd.shuffle(order)
    lengths = [len(rows[i].token_ids) for i in order]
    budget = rnd.randint(max(lengths), 2 * max(lengths))
    packed = [collate(rows, advantages, [order[i] for i in group], TRAINED)
              for group in pack(lengths, budget)]
    assert torch.allclose(gradient(model, packed), reference, atol=1e-6, rtol=0)
    per_rollout = {row.rollout_id: a for row, a in zip(rows, advantages, strict=True)}
    flat_rows = [row for r in rollouts for row in to_rows(flat(r))]
    flat_adv = [per_rollout[row.rollout_id.split("/")[0]] for row in flat_rows]
    singles = [collate(flat_rows, flat_adv, [i], TRAINED) for i in range(len(flat_rows))]
    assert torch.allclose(gradient(model, singles), reference, atol=1e-6, rtol=0)
    assert reference.abs().max() > 0


def test_the_hand_worked_tree() -> None:
    """A parent with 2 rows and two subagents with 1 and 3 rows, in a group with a
    one-row rollout: rewards 1 and 0 give +0.5 / -0.5 on every row (counting rows would
    give a baseline of 6/7: +1/7 and -6/7), and each of the 15 generated tokens weighs
    1/15 of the update, whichever thread it is in."""
    tree = Rollout("g-a", "g", "x", [
        _segment(2, [0, 0], 1, "main"), _segment(3, [0] * 3, 2, "main"),
        _segment(1, [0], 3, "1"),
        _segment(2, [0, 0], 4, "2"), _segment(2, [0, 0], 5, "2"), _segment(1, [0], 6, "2"),
    ], 1.0, threads=[Thread("1", origin="ask(0)"), Thread("2", origin="ask(1)")])
    single = Rollout("g-b", "g", "x", [_segment(4, [0] * 4, 7, "main")], 0.0)
    rows = to_rows([tree, single])
    assert [r.thread for r in rows] == ["main", "main", "1", "2", "2", "2", "main"]
    assert [r.num_generated_tokens for r in rows] == [2, 3, 1, 2, 2, 1, 4]
    advantages = compute_advantages(rows)
    assert advantages == [0.5] * 6 + [-0.5]
    mb = collate(rows, advantages, list(range(len(rows))))
    assert mb.num_tokens == 15
    # the policy gradient at ratio 1: d loss / d logprob = -advantage / N for every token
    from agentrl.config import LossConfig
    from agentrl.loss import policy_loss

    logprobs = mb.old_logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask,
                          mb.num_tokens, LossConfig())
    loss.backward()
    weights = (-logprobs.grad[mb.loss_mask > 0] * 15).tolist()
    assert weights == pytest.approx([0.5] * 11 + [-0.5] * 4)
    # `agentrl inspect BATCH.json` tells it the same way
    from agentrl.rollout.describe import describe_batch

    text = describe_batch([tree, single])
    assert "rollout g-a · reward 1 · 6 rows · 11 generated tokens → +0.5   (baseline 0.5)" \
        in text
    assert "3 threads (main + 2 subagent), one reward and one advantage" in text
    assert "row 5 (thread 2): 6 tokens (3 prompt, 1 generated) · reward copy 1 · " \
        "advantage +0.5" in text
    assert "the token-level loss divides by 15 generated tokens" in text

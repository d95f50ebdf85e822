"""Packing, balancing and collation: budgets, coverage, equal micro-batch counts, alignment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.packing import CostModel, balance, collate, pack, plan_micro_batches, report
from agentrl.types import Row

COST = CostModel(a=100.0, b=1.0)
lengths_st = st.lists(st.integers(1, 64), min_size=0, max_size=60)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, budget=st.integers(64, 200))
def test_pack_respects_budget_and_places_every_row_once(lengths: list[int], budget: int) -> None:
    bins = pack(lengths, budget)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= budget for b in bins)
    assert all(b for b in bins)  # no empty micro-batch from pack itself
    # any-fit packing opens a micro-batch only when a row fits in none of the open ones, so
    # no two micro-batches could be merged (hence at most one is half empty). (A bound
    # against the volume lower bound would be wrong: [32, 33, 33, 33, 33] in 64 needs 5.)
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert all(a + b > budget for i, a in enumerate(loads) for b in loads[i + 1:])


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, budget=st.integers(64, 200), num_ranks=st.integers(1, 5))
def test_plan_covers_rows_once_with_equal_micro_batch_counts(
    lengths: list[int], budget: int, num_ranks: int
) -> None:
    plan = plan_micro_batches(lengths, budget, num_ranks, COST)
    assert len(plan) == num_ranks
    assert len({len(p) for p in plan}) == 1  # same count on every rank: no deadlock
    placed = sorted(i for p in plan for mb in p for i in mb)
    assert placed == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= budget for p in plan for mb in p)


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, num_ranks=st.integers(1, 6))
def test_balance_places_each_row_once_within_the_greedy_bound(
    lengths: list[int], num_ranks: int
) -> None:
    ranks = balance(lengths, num_ranks, COST)
    assert len(ranks) == num_ranks
    assert sorted(i for r in ranks for i in r) == list(range(len(lengths)))
    costs = [sum(COST.cost(lengths[i]) for i in r) for r in ranks]
    # greedy list scheduling guarantee (swaps only lower the max): max <= mean + costliest row
    biggest = max((COST.cost(n) for n in lengths), default=0.0)
    assert max(costs) <= sum(costs) / num_ranks + biggest + 1e-6


def test_overlong_row_is_refused_with_index_length_budget_and_fix() -> None:
    with pytest.raises(ValueError) as err:
        pack([10, 300, 20], 256)
    message = str(err.value)
    assert "row 1" in message and "300" in message and "256" in message
    assert "max_tokens_per_microbatch" in message
    with pytest.raises(ValueError, match="row 0"):
        plan_micro_batches([999], 256, 2, COST)


def test_balance_evens_flops_not_tokens() -> None:
    # one long row costs as much as many short ones under a·L + b·L²
    lengths = [1000] + [100] * 20
    cost = CostModel(a=0.0, b=1.0)  # cost = L²: 1e6 vs 20 × 1e4
    plan = plan_micro_batches(lengths, 1000, 2, cost)
    rep = report(lengths, plan, 1000, cost)
    # the long row alone on one rank, all 20 short ones on the other: 1e6 vs 2e5
    ranks_with_long = [p for p in plan if any(0 in mb for mb in p)]
    assert [i for mb in ranks_with_long[0] for i in mb] == [0]
    assert rep.balance == pytest.approx(1e6 / 6e5)
    assert rep.num_micro_batches == 2 * 2  # rank with 20×100 needs 2 micro-batches; padded


def test_report_density_counts_padding_micro_batches() -> None:
    plan = [[[0, 1]], [[2], []]]  # 2 ranks; the first would have been padded to 2
    rep = report([50, 50, 100], plan, 100, COST)
    assert rep.density == pytest.approx(200 / (3 * 100))
    assert rep.num_rows == 3 and rep.num_tokens == 200


def test_cost_model_from_model_args() -> None:
    cost = CostModel.from_model_args(hidden=8, layers=2, intermediate=16, vocab=10)
    per_layer = 2 * 64 * 2 + 3 * 8 * 16
    assert cost.a == 6 * (2 * per_layer + 8 * 10)
    assert cost.b == 6 * 2 * 8
    assert cost.cost(3) == cost.a * 3 + cost.b * 9


def _row(tokens: list[int], mask: list[int], valid: bool = True, rid: str = "r") -> Row:
    logprobs = [-0.1 * (k + 1) if m else 0.0 for k, m in enumerate(mask)]
    return Row(
        rollout_id=rid, group_id="g", env="e", segment=0, token_ids=tokens, loss_mask=mask,
        logprobs=logprobs, reward=1.0, valid=valid,
    )


def test_collate_positions_targets_and_advantage_placement() -> None:
    # row a: prompt 2 tokens, generated 2, observation 1, generated 1
    a = _row([10, 11, 12, 13, 14, 15], [0, 0, 1, 1, 0, 1], rid="a")
    b = _row([20, 21, 22], [0, 1, 1], rid="b")
    c = _row([30, 31], [0, 1], valid=False, rid="c")
    mb = collate([a, b, c], [0.5, -2.0, 7.0], [1, 0, 2])  # order b, a, c
    # each row's last token predicts nothing and nothing attends to it: it is left out
    assert mb.cu_seqlens.tolist() == [0, 2, 7, 8]
    assert mb.cu_seqlens.dtype == torch.int32
    assert mb.bounds == (0, 2, 7, 8)
    assert mb.position_ids[0].tolist() == [0, 1, 0, 1, 2, 3, 4, 0]
    assert mb.input_ids[0].tolist() == [20, 21, 10, 11, 12, 13, 14, 30]
    # targets are the next token of the same row, the left-out last one included
    assert mb.target_ids[0].tolist() == [21, 22, 11, 12, 13, 14, 15, 31]
    # mask: the *target* was generated and the row is valid (row c is invalid)
    assert mb.loss_mask[0].tolist() == [1, 1, 0, 1, 1, 0, 1, 0]
    # the advantage reaches each generated token of its row, no prompt/observation token
    assert mb.advantages[0].tolist() == [-2, -2, 0, 0.5, 0.5, 0, 0.5, 0]
    expected_lp = [-0.2, -0.3, 0, -0.3, -0.4, 0, -0.6, 0]
    assert mb.engine_logprobs[0].tolist() == pytest.approx(expected_lp)
    assert mb.head_positions.tolist() == [0, 1, 3, 4, 6]
    assert torch.equal(mb.old_logprobs, mb.engine_logprobs)
    assert mb.num_tokens == 5 and mb.num_rows == 3


def test_collate_empty_is_one_masked_token() -> None:
    mb = collate([], [], [])
    assert mb.input_ids.shape == (1, 1) and mb.num_tokens == 0
    assert mb.loss_mask.sum() == 0 and mb.cu_seqlens.tolist() == [0, 1]


def test_collate_refuses_misaligned_row() -> None:
    bad = Row(rollout_id="x", group_id="g", env="e", segment=2, token_ids=[1, 2, 3],
              loss_mask=[0, 1], logprobs=[0.0, -1.0], reward=0.0)
    with pytest.raises(ValueError, match="row 0 \\(x segment 2\\)"):
        collate([bad], [1.0], [0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 2**12)), min_size=1, max_size=8))
def test_collate_advantage_only_on_generated_targets(spec: list[tuple[int, int]]) -> None:
    rows = []
    for n, bits in spec:
        mask = [(bits >> k) & 1 for k in range(n)]
        rows.append(_row(list(range(n)), mask))
    advs = [float(k + 1) for k in range(len(rows))]
    mb = collate(rows, advs, list(range(len(rows))))
    cu = mb.cu_seqlens.tolist()
    for k, row in enumerate(rows):
        adv = mb.advantages[0, cu[k] : cu[k + 1]].tolist()
        expected = [advs[k] * m for m in row.loss_mask[1:]]  # the last token left out
        assert adv == (expected or [0.0])  # a one-token row keeps its token
    assert mb.num_tokens == sum(sum(r.loss_mask[1:]) for r in rows)

"""Split across 2 gloo ranks with FSDP2, one update gives the single-process gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_update import CFG, COST, gradient, make_model, make_rows, micro_batches_for

from agentrl.packing import plan_micro_batches
from agentrl.parallel import groups
from agentrl.parallel.fsdp import iter_full_parameters, shard_model
from agentrl.train.update import forward_backward
from tests.parallel.ranks import spawn_ranks

NUM_RANKS = 2
BUDGET = 48


def _worker(rank: int, out_dir: str) -> None:
    model = shard_model(make_model(seed=0), None, torch.device("cpu"))
    rows, advantages = make_rows(num_rows=13)
    plan = plan_micro_batches([len(r.token_ids) for r in rows], BUDGET, NUM_RANKS, COST)
    mbs = micro_batches_for(rows, advantages, plan[groups.get_rank()])
    stats = forward_backward(model, mbs, CFG)
    grads = torch.cat([p.grad.full_tensor().reshape(-1) for p in model.parameters()])
    torch.save({"grad": grads, "stats": stats.loss, "num_tokens": stats.num_tokens,
                "num_micro": len(mbs)}, Path(out_dir) / f"rank{rank}.pt")


def test_two_fsdp_ranks_give_the_single_process_gradient(tmp_path: Path) -> None:
    spawn_ranks(NUM_RANKS, _worker, str(tmp_path))
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(NUM_RANKS)]

    rows, advantages = make_rows(num_rows=13)
    model = make_model(seed=0)
    everything = micro_batches_for(rows, advantages, [list(range(len(rows)))])
    reference = gradient(model, everything)
    model.zero_grad(set_to_none=True)
    reference_loss = forward_backward(model, everything, CFG).loss

    plan = plan_micro_batches([len(r.token_ids) for r in rows], BUDGET, NUM_RANKS, COST)
    assert all(len(p) > 0 for p in plan)  # each rank really holds part of the rows
    assert results[0]["num_micro"] == results[1]["num_micro"]
    for res in results:
        assert torch.allclose(res["grad"], reference, atol=1e-6, rtol=0)
        assert res["num_tokens"] == everything[0].num_tokens  # summed over both ranks
        assert abs(res["stats"] - reference_loss) < 1e-6
    # averaging instead of summing across ranks would halve the gradient: the test sees it
    assert (reference / NUM_RANKS - reference).abs().max() > 1e-4


def _unsharded_worker(rank: int) -> None:
    rows, advantages = make_rows(num_rows=4)
    mbs = micro_batches_for(rows, advantages, [[rank, rank + 2]])
    with pytest.raises(ValueError, match="FSDP2-sharded"):
        forward_backward(make_model(), mbs, CFG, process_group=None)
    plain = make_model()  # a plain model needs no gather: its own tensors, every one
    full = dict(iter_full_parameters(plain))
    assert full.keys() == dict(plain.named_parameters()).keys()
    assert all(torch.equal(full[n], p) for n, p in plain.named_parameters())


def test_several_ranks_refuse_a_model_that_would_not_sum_gradients() -> None:
    spawn_ranks(NUM_RANKS, _unsharded_worker)

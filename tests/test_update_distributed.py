"""Split across 2 gloo processes, one update gives the single-process gradient."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp
from test_update import CFG, COST, gradient, make_model, make_rows, micro_batches_for

from agentrl import distributed
from agentrl.packing import plan_micro_batches
from agentrl.update import forward_backward

NUM_RANKS = 2
BUDGET = 48


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    group = distributed.init_process_group(rank, NUM_RANKS, f"file://{init_file}", "gloo")
    try:
        # rank 1 starts from other weights: wrap_model must make them rank 0's
        model = distributed.wrap_model(make_model(seed=rank), group)
        rows, advantages = make_rows(num_rows=13)
        plan = plan_micro_batches([len(r.token_ids) for r in rows], BUDGET, NUM_RANKS, COST)
        mbs = micro_batches_for(rows, advantages, plan[distributed.get_rank(group)])
        stats = forward_backward(model, mbs, CFG, process_group=group)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.save({"grad": grads, "stats": stats.loss, "num_tokens": stats.num_tokens,
                    "num_micro": len(mbs)}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.destroy_process_group()


def test_two_gloo_ranks_give_the_single_process_gradient(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=NUM_RANKS)
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

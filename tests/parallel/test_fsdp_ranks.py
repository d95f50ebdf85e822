"""FSDP2 over 1, 2 and 4 gloo ranks, and one rank unwrapped as the trainer keeps it in fp32:
the same weights after 4 updates, 1/N of the bytes each.

Each rank trains on its FLOPs-balanced share of every update's rows; the token count and
the gradients are summed over ranks, so the rank count changes nothing but float rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import OptimConfig
from agentrl.model.checkpoint import save_pretrained
from agentrl.packing import plan_micro_batches
from agentrl.parallel import groups
from agentrl.parallel.fsdp import (
    clip_grad_norm,
    full_state_dict,
    is_sharded,
    load_sharded,
    local_bytes,
    optimizer_tensors,
    shard_model,
)
from agentrl.train.optimizer import build_optimizer
from agentrl.train.run_parts import read_model_state
from agentrl.train.update import forward_backward
from tests.parallel.ranks import spawn_ranks
from tests.test_update import CFG, COST, make_model, make_rows, micro_batches_for

NUM_UPDATES = 4
ROWS_PER_UPDATE = 6
BUDGET = 40


def _train(rank: int, out_dir: str, as_trainer: bool = False) -> None:
    world = groups.get_world_size()
    if as_trainer:  # the trainer's own loading: fp32 on one rank stays plain
        folder = Path(out_dir) / "initial"
        if rank == 0:
            save_pretrained(make_model(seed=0), folder)
        state = groups.run_on_main("read", lambda: read_model_state(folder), 60)
        model = load_sharded(folder, state or {}, torch.float32, torch.float32, "torch",
                             torch.device("cpu"))
        assert is_sharded(model) == (world > 1)
    else:
        model = shard_model(make_model(seed=0), None, torch.device("cpu"))
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    rows, advantages = make_rows(num_rows=NUM_UPDATES * ROWS_PER_UPDATE, seed=1)
    for update in range(NUM_UPDATES):
        chunk = list(range(update * ROWS_PER_UPDATE, (update + 1) * ROWS_PER_UPDATE))
        lengths = [len(rows[i].token_ids) for i in chunk]
        mine = plan_micro_batches(lengths, BUDGET, world, COST)[rank]
        mbs = micro_batches_for(rows, advantages, [[chunk[j] for j in mb] for mb in mine])
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, mbs, CFG)
        clip_grad_norm(model, 1.0)
        optimizer.step()
    weights = full_state_dict(model)
    sizes = {"params": local_bytes(list(model.parameters())),
             "optimizer": local_bytes(optimizer_tensors(optimizer))}
    torch.save({"sizes": sizes, "weights": weights if rank == 0 else None},
               Path(out_dir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[int, list[dict]]:
    out = {}
    for world in (1, 2, 4, "plain"):
        folder = tmp_path_factory.mktemp(f"ranks{world}")
        spawn_ranks(1 if world == "plain" else world, _train, str(folder), world == "plain")
        out[world] = [torch.load(folder / f"rank{r}.pt") for r in range(len(
            list(folder.glob("rank*.pt"))))]
    return out


def test_one_two_and_four_ranks_end_with_the_same_weights(results) -> None:
    one = results[1][0]["weights"]
    start = make_model(seed=0).state_dict()
    assert any((one[k] - start[k]).abs().max() > 1e-3 for k in one)  # the updates moved it
    for world in (2, 4, "plain"):
        other = results[world][0]["weights"]
        for name, tensor in one.items():
            torch.testing.assert_close(other[name], tensor, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_about_one_nth_of_parameters_and_optimizer_state(results,
                                                                         world) -> None:
    whole = results[1][0]["sizes"]
    assert whole["optimizer"] >= 2 * whole["params"]  # AdamW: exp_avg and exp_avg_sq
    for kind in ("params", "optimizer"):
        shares = [r["sizes"][kind] / whole[kind] for r in results[world]]
        assert sum(shares) == pytest.approx(1.0, abs=0.01)  # a partition, nothing copied
        for share in shares:
            assert 0.7 / world <= share <= 1.3 / world, (kind, shares)

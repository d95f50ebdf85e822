"""A resume with another rank count: 2 → 1 and 1 → 2 ranks continue the run exactly.

Two updates on one rank count, a checkpoint, two more on the other: the weights end where
four uninterrupted updates on one rank end (to float rounding, as for any rank count), so
the AdamW moments and its step counts came back resharded, not fresh.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import OptimConfig
from agentrl.parallel import groups
from agentrl.parallel.fsdp import (
    clip_grad_norm,
    full_state_dict,
    load_sharded,
    shard_model,
    shards,
)
from agentrl.train.checkpoint import (
    TrainerState,
    load_training_state,
    save_checkpoint,
    step_dir,
)
from agentrl.train.optimizer import build_optimizer
from agentrl.train.run_parts import read_model_state
from agentrl.train.update import forward_backward
from tests.parallel.ranks import spawn_ranks
from tests.test_update import CFG, COST, make_model, make_rows, micro_batches_for

OPTIM = OptimConfig(lr=1e-2)
ROWS_PER_UPDATE = 6
BUDGET = 40


def _update(model, optimizer, number: int) -> None:
    """Update ``number`` of the run: this rank's FLOPs-balanced share of its rows."""
    rank, world = groups.get_rank(), groups.get_world_size()
    rows, advantages = make_rows(num_rows=4 * ROWS_PER_UPDATE, seed=1)
    chunk = list(range(number * ROWS_PER_UPDATE, (number + 1) * ROWS_PER_UPDATE))
    mine = plan_micro_batches_for(rows, chunk, world)[rank]
    optimizer.zero_grad(set_to_none=True)
    forward_backward(model, micro_batches_for(rows, advantages, mine), CFG)
    clip_grad_norm(model, 1.0)
    optimizer.step()


def plan_micro_batches_for(rows, chunk: list[int], world: int) -> list[list[list[int]]]:
    from agentrl.packing import plan_micro_batches

    plan = plan_micro_batches([len(rows[i].token_ids) for i in chunk], BUDGET, world, COST)
    return [[[chunk[j] for j in mb] for mb in rank_plan] for rank_plan in plan]


def _first_half(rank: int, run_dir: str, updates: int) -> None:
    model = make_model(seed=0)
    if shards(groups.get_world_size(), mixed_precision=False):  # one rank: plain, as the
        model = shard_model(model, None, torch.device("cpu"))  # trainer keeps it in fp32
    optimizer = build_optimizer(model, OPTIM)
    for number in range(updates):
        _update(model, optimizer, number)
    weights = full_state_dict(model)
    if updates == 4:  # the uninterrupted reference
        if rank == 0:
            torch.save(weights, Path(run_dir) / "final.pt")
        return
    save_checkpoint(run_dir, TrainerState(step=updates, num_updates=updates), model,
                    optimizer, None)


def _second_half(rank: int, run_dir: str) -> None:
    path = step_dir(run_dir, 2)
    state = groups.run_on_main("resume", lambda: read_model_state(path), 60)
    model = load_sharded(path, state or {}, torch.float32, torch.float32, "torch",
                         torch.device("cpu"))
    optimizer = build_optimizer(model, OPTIM)
    restored = load_training_state(path, model, optimizer, None)
    steps = {float(s["step"]) for s in optimizer.state.values()}
    for number in range(restored.num_updates, 4):
        _update(model, optimizer, number)
    weights = full_state_dict(model)
    if rank == 0:
        torch.save({"weights": weights, "adam_steps": steps, "updates": restored.num_updates},
                   Path(run_dir) / "final.pt")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("straight")
    spawn_ranks(1, _first_half, str(folder), 4)
    return torch.load(folder / "final.pt")


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)], ids=["2to1", "1to2"])
def test_a_resume_on_another_rank_count_continues_the_run(uninterrupted, tmp_path, before,
                                                          after) -> None:
    spawn_ranks(before, _first_half, str(tmp_path), 2)
    spawn_ranks(after, _second_half, str(tmp_path))
    resumed = torch.load(tmp_path / "final.pt")
    assert resumed["updates"] == 2 and resumed["adam_steps"] == {2.0}  # moments came back
    start = make_model(seed=0).state_dict()
    assert any((uninterrupted[k] - start[k]).abs().max() > 1e-3 for k in start)  # it moved
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed["weights"][name], tensor, atol=1e-5, rtol=0,
                                   msg=name)

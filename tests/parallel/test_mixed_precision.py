"""Mixed precision keeps small updates: fp32 master weights and AdamW state, bf16 compute.

At lr 3e-6 an update is far below bf16's resolution near typical weights (about 1e-4 at
0.02), so a model stored and stepped in bf16 loses almost all of it. Here the same five
updates run three ways on the tiny decoder: fp32 throughout (the reference), FSDP2 with
bf16 compute over fp32 master weights (what training does), and the old bf16 storage.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.config import OptimConfig
from agentrl.parallel import groups
from agentrl.parallel.fsdp import clip_grad_norm, full_state_dict, is_sharded, shard_model
from agentrl.train.optimizer import build_optimizer
from agentrl.train.update import forward_backward
from tests.test_update import CFG, make_model, make_rows, micro_batches_for

LR = 3e-6
NUM_UPDATES = 5


@pytest.fixture(scope="module")
def micro_batches():
    groups.init_process_group(timeout_s=60)
    rows, advantages = make_rows(num_rows=16)
    return micro_batches_for(rows, advantages, [list(range(8)), list(range(8, 16))])


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = full_state_dict(model) if is_sharded(model) else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def _weight_change(model: torch.nn.Module, micro_batches) -> torch.Tensor:
    start = _weights(model)
    optimizer = build_optimizer(model, OptimConfig(lr=LR))
    for _ in range(NUM_UPDATES):
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, micro_batches, CFG)
        clip_grad_norm(model, 1.0)
        optimizer.step()
    end = _weights(model)
    return torch.cat([(end[k].float() - start[k].float()).reshape(-1) for k in start
                      if k != "lm_head.weight"])  # tied to the embedding: counted once


def _agreement(change: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(share of the weights the reference changed that also changed, cosine)."""
    changed = reference != 0
    kept = float(((change != 0) & changed).sum() / changed.sum())
    return kept, float(torch.nn.functional.cosine_similarity(change, reference, dim=0))


def test_bf16_compute_over_fp32_master_weights_keeps_every_update(micro_batches) -> None:
    fp32 = _weight_change(shard_model(make_model(), None, torch.device("cpu")), micro_batches)
    mixed = _weight_change(shard_model(make_model(), torch.bfloat16, torch.device("cpu")),
                           micro_batches)
    assert float((fp32 != 0).float().mean()) > 0.9  # the reference run moves the weights
    kept, cosine = _agreement(mixed, fp32)
    assert kept >= 0.99
    assert cosine >= 0.99
    assert 0.9 < float(mixed.abs().mean() / fp32.abs().mean()) < 1.1


def test_weights_stored_and_stepped_in_bf16_lose_the_updates(micro_batches) -> None:
    # what model.dtype = "bfloat16" did before: the test above would fail on it
    fp32 = _weight_change(shard_model(make_model(), None, torch.device("cpu")), micro_batches)
    bf16 = _weight_change(make_model().to(torch.bfloat16), micro_batches)
    kept, cosine = _agreement(bf16, fp32)
    assert kept < 0.5 and cosine < 0.5


def test_master_weights_gradients_and_optimizer_state_are_fp32(micro_batches) -> None:
    model = shard_model(make_model(), torch.bfloat16, torch.device("cpu"))
    optimizer = build_optimizer(model, OptimConfig(lr=LR))
    forward_backward(model, micro_batches, CFG)
    optimizer.step()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert {v.dtype for s in optimizer.state.values() for k, v in s.items()
            if k != "step"} == {torch.float32}

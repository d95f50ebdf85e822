"""Mixed precision keeps small updates: fp32 master weights and AdamW state, bf16 compute.

At lr 3e-6 an update is far below bf16's resolution near typical weights (about 1e-4 at
0.02), so a model stored and stepped in bf16 loses almost all of it. Here the same five
updates run three ways on the tiny decoder: fp32 throughout (the reference), FSDP2 with
bf16 compute over fp32 master weights (what training does), and the old bf16 storage.
One CPU rank casts in each module's forward instead of FSDP2 (``compute_in``): the same
arithmetic, checked against FSDP2's.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.config import OptimConfig
from agentrl.parallel import groups
from agentrl.parallel.cast import compute_in
from agentrl.parallel.fsdp import (
    clip_grad_norm,
    full_state_dict,
    is_sharded,
    shard_model,
    shards,
)
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


def _fsdp2_or_cast(layout: str) -> torch.nn.Module:
    if layout == "fsdp2":
        return shard_model(make_model(), torch.bfloat16, torch.device("cpu"))
    return compute_in(make_model(), torch.bfloat16)


def _full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if is_sharded(model) else p.grad).clone()
            for n, p in model.named_parameters()}


def test_only_a_cpu_rank_alone_in_mixed_precision_casts_without_fsdp2() -> None:
    assert not shards(1, mixed_precision=True, on_cpu=True)
    assert shards(1, mixed_precision=True, on_cpu=False)  # one GPU: FSDP2's casts
    assert shards(2, mixed_precision=True, on_cpu=True) and shards(2, False, on_cpu=True)
    assert not shards(1, mixed_precision=False)


def test_casting_in_each_forward_computes_what_fsdp2_mixed_precision_does(micro_batches):
    """One micro-batch: the same loss and the same fp32 gradients, bit for bit (the same
    bf16 copies of the weights meet the same inputs); over several, FSDP2 accumulates its
    unsharded gradients between syncs in its own way, so they agree to bf16 rounding."""
    fsdp2, cast = _fsdp2_or_cast("fsdp2"), _fsdp2_or_cast("cast")
    assert not is_sharded(cast) and cast.dtype == torch.bfloat16
    one = [forward_backward(m, micro_batches[:1], CFG) for m in (fsdp2, cast)]
    assert one[0].loss == one[1].loss
    first = [_full_grads(m) for m in (fsdp2, cast)]
    for name, grad in first[0].items():
        assert grad.dtype == first[1][name].dtype == torch.float32
        assert torch.equal(grad, first[1][name]), name
    for model in (fsdp2, cast):
        model.zero_grad(set_to_none=True)
        forward_backward(model, micro_batches, CFG)
    both = [_full_grads(m) for m in (fsdp2, cast)]
    for name, grad in both[0].items():
        torch.testing.assert_close(both[1][name], grad, atol=1e-3, rtol=1e-2, msg=name)
    assert all(p.dtype == torch.float32 and "weight" not in vars(m)
               for m in cast.modules() for p in m.parameters(recurse=False))


@pytest.mark.parametrize("layout", ["fsdp2", "cast"])
def test_master_weights_gradients_and_optimizer_state_are_fp32(micro_batches, layout) -> None:
    model = _fsdp2_or_cast(layout)
    optimizer = build_optimizer(model, OptimConfig(lr=LR))
    forward_backward(model, micro_batches, CFG)
    optimizer.step()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert {v.dtype for s in optimizer.state.values() for k, v in s.items()
            if k != "step"} == {torch.float32}


@pytest.mark.parametrize("amx", [True, False])
def test_auto_float32_on_a_cpu_with_amx_points_at_bf16(monkeypatch, amx) -> None:
    from agentrl.parallel.cast import bf16_hint

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    cpu = torch.device("cpu")
    hint = bf16_hint("auto", torch.float32, cpu)
    assert (hint is not None) == amx
    if amx:
        assert 'model.dtype = "bfloat16"' in hint and "docs/peers.md" in hint
    # a dtype the user chose, or bf16 already, or a GPU: nothing to suggest
    assert bf16_hint("float32", torch.float32, cpu) is None
    assert bf16_hint("auto", torch.bfloat16, torch.device("cuda")) is None
    assert bf16_hint("bfloat16", torch.bfloat16, cpu) is None

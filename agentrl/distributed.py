"""Data-parallel plumbing: process groups, rank/world size, all-reduces, model wrapping.

gloo on CPU (tests), NCCL on GPUs. Gradients are SUMMED across ranks, never averaged:
the loss already divides by the whole update's token count (all ranks), so a sum gives
each token its 1/N weight whatever the rank count.

``wrap_model`` is the one place a model gets wrapped for data parallelism; today it
returns the model unchanged and ``all_reduce_gradients`` does a DDP-style bucketed sum,
so switching to FSDP2 (``fully_shard``) later touches only this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

_BUCKET_NUMEL = 25_000_000
"""Elements per flattened all-reduce: fewer, larger collectives than one per parameter."""


def init_process_group(
    rank: int,
    world_size: int,
    init_method: str | None = None,
    backend: str = "auto",
) -> dist.ProcessGroup:
    """Join the default process group; "auto" picks NCCL when CUDA is available, else gloo.

    ``init_method`` is "file:///path" or "tcp://127.0.0.1:PORT"; None reads MASTER_ADDR /
    MASTER_PORT from the environment (as torchrun sets them).
    """
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f'backend {backend!r} is not supported; use "auto", "nccl" or "gloo"')
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    if init_method is None and "MASTER_ADDR" not in os.environ:
        raise ValueError(
            "no init_method and no MASTER_ADDR in the environment; pass "
            'init_method="tcp://127.0.0.1:PORT" (or file:///path) or launch with torchrun'
        )
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    group = dist.group.WORLD
    assert group is not None
    return group


def destroy_process_group() -> None:
    """Leave the default process group if one was joined (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """True when collectives are needed: a group exists and it has more than one rank."""
    return dist.is_available() and dist.is_initialized() and get_world_size(group) > 1


def get_rank(group: dist.ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (0 without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


def get_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Number of ranks in ``group`` (1 without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place and return it (a no-op on one rank)."""
    if is_distributed(group):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_reduce_scalar(
    value: float, group: dist.ProcessGroup | None = None, device: torch.device | None = None
) -> float:
    """The sum of one number over ranks (float64 so token counts stay exact)."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    return float(all_reduce_sum(tensor, group).item())


def all_reduce_gradients(
    parameters: Iterable[nn.Parameter], group: dist.ProcessGroup | None = None
) -> None:
    """Sum every parameter's gradient over ranks, in flattened buckets.

    A parameter without a gradient gets a zero one first: every rank must hand the same
    tensors to each collective, whether or not its micro-batches touched the parameter.
    """
    if not is_distributed(group):
        return
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        bucket.append(p.grad)
        size += p.grad.numel()
        if size >= _BUCKET_NUMEL:
            _reduce_bucket(bucket, group)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, group)


def _reduce_bucket(grads: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Copy rank 0's parameters and buffers to every rank, so all ranks start identical."""
    if not is_distributed(group):
        return
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0, group=group)


def wrap_model(model: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """Prepare a model for data-parallel training: the single place wrapping happens.

    Today: parameters are broadcast from rank 0 and gradients are summed explicitly by
    ``all_reduce_gradients`` after the micro-batches. FSDP2 would replace this body with
    ``fully_shard`` per block, and ``all_reduce_gradients`` with a no-op.
    """
    broadcast_parameters(model, group)
    return model

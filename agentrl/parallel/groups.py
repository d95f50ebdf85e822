"""Process groups, ranks and devices: torchrun's env:// rendezvous, or one local process.

Every training process joins a process group, even alone: a single process gets a group
of one (an in-memory store, no ports), so one code path (FSDP2, the same collectives)
serves 1 rank, 8 ranks and several machines. Under ``torchrun`` the group comes from the
environment it sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``);
each process drives the GPU ``LOCAL_RANK`` of its machine.

Every collective carries ``train.collective_timeout_s``. Ranks never sit in a collective
while rank 0 works alone (generation, validation, writing a checkpoint): they wait on a
flag in the group's key-value store with their own long timeout (:func:`wait_for_main`),
and only then enter the collective that follows.
"""

from __future__ import annotations

import datetime
import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class _FirstComeFirstServed:
    """A lock taken in the order it was asked for: the trainer, asking again right after
    each micro-batch, can never starve a waiting weight sync (nor the reverse)."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._turns:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._turns.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._turns:
            self._serving += 1
            self._turns.notify_all()


_ONE_COMMUNICATOR = _FirstComeFirstServed()
_SHARED_GPU = threading.Event()


def share_gpu_between_threads(shared: bool = True) -> None:
    """Another thread of this process drives NCCL work on the trainer's GPU at the same
    time as the trainer (the asynchronous collector's weight syncs): from now on
    :func:`one_communicator_at_a_time` serializes the two."""
    if shared:
        _SHARED_GPU.set()
    else:
        _SHARED_GPU.clear()


@contextmanager
def one_communicator_at_a_time(stream: Any = None) -> Iterator[None]:
    """Hold the GPU for one NCCL communicator's work: the trainer's FSDP2 collectives of
    one micro-batch (or a weight gather), or one bucket of a weight sync to a replica.
    NCCL warns that kernels of two communicators running at once on a GPU can deadlock;
    with asynchronous collection the collector thread syncs weights while the trainer
    trains. On leaving normally, the work queued on ``stream`` (default: this thread's
    current stream, where FSDP2's own streams end) has finished, so the next holder never
    overlaps it; leaving by an error does not wait (a stuck kernel must not hold the
    lock: the caller aborts its communicator). Free (no lock, no wait) unless
    :func:`share_gpu_between_threads` is on."""
    if not _SHARED_GPU.is_set():
        yield
        return
    with _ONE_COMMUNICATOR:
        yield
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            (stream or torch.cuda.current_stream()).synchronize()


def launched_by_torchrun() -> bool:
    """True when this process was started by torchrun (or another env:// launcher)."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def local_device() -> torch.device:
    """This process's device: GPU ``LOCAL_RANK`` of its machine when there is a GPU, else
    the CPU. (Not ``rank % device_count``: ranks of other machines have other numbers.)"""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_process_group(timeout_s: float, backend: str = "auto") -> dist.ProcessGroup:
    """Join (or reuse) the default process group; returns it.

    Under torchrun: env:// with ``timeout_s`` on every collective. Otherwise a group of
    one process on an in-memory store. "auto" picks NCCL with CUDA, else gloo.
    """
    if dist.is_initialized():
        return _world()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f'backend {backend!r} is not supported; use "auto", "nccl" or "gloo"')
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if launched_by_torchrun():
        dist.init_process_group(backend, init_method="env://", timeout=timeout,
                                device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    return _world()


def _world() -> dist.ProcessGroup:
    group = dist.group.WORLD
    assert group is not None
    return group


def destroy_process_group() -> None:
    """Leave the default process group if one was joined (safe to call twice).

    Garbage is collected right after, so the group (which models and meshes keep alive
    through reference cycles) is freed and its gloo worker threads are joined while the
    interpreter still runs: a worker that frees a Python-owned tensor during interpreter
    shutdown cannot take the GIL and aborts the process ("terminate called without an
    active exception"). Call it once nothing of the run is referenced any more.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


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
    """The sum of one number over ranks (float64 so token counts stay exact). ``device``
    must be the group's device (a GPU for NCCL)."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    return float(all_reduce_sum(tensor, group).item())


def broadcast_object(obj: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's ``obj`` on every rank (picklable; a no-op on one rank)."""
    if not is_distributed(group):
        return obj
    box = [obj if get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


class MainRankTimeout(RuntimeError):
    """Rank 0 did not finish its solo work within the wait timeout."""


def signal_main_done(tag: str, group: dist.ProcessGroup | None = None) -> None:
    """Rank 0: mark the solo work ``tag`` as done, releasing :func:`wait_for_main`."""
    if is_distributed(group) and get_rank(group) == 0:
        _store().set(f"agentrl/{tag}", b"done")


def wait_for_main(tag: str, timeout_s: float, group: dist.ProcessGroup | None = None) -> None:
    """Ranks 1..N: wait (outside any collective) until rank 0 signals ``tag`` done.

    The wait has its own, long timeout (the rollout and validation budgets), so the
    collective timeout can stay short; a lost rank 0 ends the wait with an error naming
    the work and the setting instead of a hang.
    """
    if not is_distributed(group) or get_rank(group) == 0:
        return
    try:
        _store().wait([f"agentrl/{tag}"], datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise MainRankTimeout(
            f"rank {get_rank(group)} waited {timeout_s:.0f}s for rank 0 to finish "
            f"'{tag}'; raise train.wait_for_rank0_timeout_s if rank 0's collections, "
            f"validations and checkpoints really take that long ({exc})"
        ) from exc


def run_on_main(tag: str, work: Any, timeout_s: float,
                group: dist.ProcessGroup | None = None) -> Any:
    """Run ``work()`` on rank 0 alone while the other ranks wait OUTSIDE any collective
    (with ``timeout_s``); returns rank 0's result on rank 0 and None elsewhere. ``tag``
    must be unique within the run."""
    result = None
    if get_rank(group) == 0:
        result = work()
        signal_main_done(tag, group)
    else:
        wait_for_main(tag, timeout_s, group)
    return result


def _store() -> dist.Store:
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()

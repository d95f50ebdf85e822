"""The data plane of a weight sync: a process group between the trainer and one replica.

Like vLLM's weight-transfer API, a sync has a control plane (start, one ``update_weights``
message per bucket naming its tensors, dtypes and shapes, finish with a version) and a
data plane (the tensors themselves, broadcast from the trainer, rank 0, to the replica's
workers, ranks ``1 .. world_size - 1``). The data plane is a group made for this replica
only, outside ``torch.distributed``'s default group (which the trainer's own ranks use):

- ``gloo``: a ``ProcessGroupGloo`` over a ``TCPStore`` the trainer hosts; CPU tensors, any
  machine that can reach the trainer's address. Each bucket travels as one flat byte
  buffer. Used by ``agentrl serve`` and by vLLM on CPU.
- ``nccl``: vLLM's own NCCL weight-transfer engine on the GPUs (``vllm`` must be
  installed on the trainer too); one broadcast per tensor, vLLM's unpacked wire format.
- ``ipc``: CUDA IPC, for a replica on the trainer's own GPUs (colocated), where NCCL
  cannot run (one GPU cannot hold two ranks of a communicator): each bucket is copied to
  every GPU of the replica and the handles travel in the update message (vLLM's IPC
  engine, unpacked format); nothing is broadcast.

Every operation has a timeout (gloo) or runs where the caller bounds it (NCCL has no
timeout of its own; ``agentrl.engines.weight_sync`` abandons a stuck call and raises).
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
import torch.distributed as dist

from agentrl.engines.auth import is_loopback

Transport = str
""""gloo" or "nccl"."""


def update_info(bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """The control-plane message of one bucket: vLLM's ``NCCLWeightTransferUpdateInfo``."""
    return {
        "names": [name for name, _ in bucket],
        "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
    }


def free_port(host: str = "") -> int:
    """A TCP port that is free right now (for a rendezvous opened by another library)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def store_host(advertise_host: str) -> str:
    """Where the trainer's rendezvous store listens: loopback for a replica on this
    machine, else the one address the replica was told (this machine's address on the
    route to it; a name that is not an address of this machine falls back to every
    interface, as before, since the store could not be reached otherwise)."""
    if not advertise_host or is_loopback(advertise_host):
        return "127.0.0.1"
    try:
        with socket.socket() as sock:
            sock.bind((advertise_host, 0))
    except OSError:  # e.g. a NAT address the replica sees, not one of ours
        return "0.0.0.0"
    return advertise_host


def _gloo_group(store: dist.Store, rank: int, world_size: int,
                timeout_s: float) -> dist.ProcessGroup:
    prefix = dist.PrefixStore("agentrl-weights", store)
    return dist.ProcessGroupGloo(prefix, rank, world_size,
                                 datetime.timedelta(seconds=timeout_s))


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([tensor], options).wait()


class GlooSender:
    """The trainer's end of a gloo group with one replica (rank 0, hosts the store)."""

    transport = "gloo"

    def __init__(self, timeout_s: float) -> None:
        """``timeout_s``: seconds the rendezvous and each broadcast may take."""
        self.timeout_s = timeout_s
        self._store: dist.TCPStore | None = None
        self._group: Any = None
        self._world_size = 0

    def open(self, advertise_host: str, world_size: int) -> dict[str, Any]:
        """Host the rendezvous store on a free port of the address the replica reaches
        (:func:`store_host`); returns the replica's init info."""
        self._store = dist.TCPStore(store_host(advertise_host), 0, world_size=world_size,
                                    is_master=True,
                                    timeout=datetime.timedelta(seconds=self.timeout_s),
                                    wait_for_workers=False)
        self._world_size = world_size
        return {"master_address": advertise_host, "master_port": int(self._store.port),
                "rank_offset": 1, "world_size": world_size, "timeout_s": self.timeout_s}

    def connect(self) -> None:
        """Join the group as rank 0 (blocks until the replica's ranks join, or times out)."""
        assert self._store is not None, "open() first"
        self._group = _gloo_group(self._store, 0, self._world_size, self.timeout_s)

    def describe(self, bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Extra fields of a bucket's update message (none: the data is broadcast)."""
        return {}

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Broadcast one bucket as a single flat byte buffer."""
        flat = torch.cat([t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                          for t in tensors])
        _broadcast(self._group, flat)

    def close(self) -> None:
        """Drop the group and the store (the next sync opens new ones)."""
        self._group = self._store = None


class GlooReceiver:
    """A replica worker's end of the gloo group (``agentrl serve``, vLLM on CPU)."""

    def __init__(self) -> None:
        self._group: Any = None

    def connect(self, init_info: dict[str, Any], worker_rank: int = 0) -> None:
        """Join the trainer's group as rank ``rank_offset + worker_rank``."""
        timeout = datetime.timedelta(seconds=float(init_info.get("timeout_s", 300.0)))
        store = dist.TCPStore(init_info["master_address"], int(init_info["master_port"]),
                              is_master=False, timeout=timeout)
        rank = int(init_info["rank_offset"]) + worker_rank
        self._group = _gloo_group(store, rank, int(init_info["world_size"]),
                                  timeout.total_seconds())

    def receive(self, info: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
        """One bucket, described by its update info, as (name, tensor) pairs."""
        if self._group is None:
            raise RuntimeError("weight transfer not initialised: the trainer must call "
                               "init_weight_transfer_engine first")
        dtypes = [getattr(torch, name) for name in info["dtype_names"]]
        shapes = [tuple(int(d) for d in shape) for shape in info["shapes"]]
        sizes = [torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                 for s, d in zip(shapes, dtypes, strict=True)]
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        _broadcast(self._group, flat)
        pieces = torch.split(flat, sizes)
        return [(name, piece.view(dtype).reshape(shape))
                for name, piece, dtype, shape in zip(info["names"], pieces, dtypes, shapes,
                                                     strict=True)]

    def close(self) -> None:
        """Leave the group."""
        self._group = None


class NcclSender:
    """The trainer's end of vLLM's NCCL weight-transfer group (GPU; needs vllm)."""

    transport = "nccl"

    def __init__(self, timeout_s: float) -> None:
        """``timeout_s`` bounds nothing here (NCCL has no timeout); the caller's does."""
        self.timeout_s = timeout_s
        self._info: dict[str, Any] = {}
        self._comm: Any = None
        self._stream: Any = None

    def open(self, advertise_host: str, world_size: int) -> dict[str, Any]:
        """Pick the rendezvous port; returns vLLM's ``NCCLWeightTransferInitInfo``."""
        self._info = {"master_address": advertise_host, "master_port": free_port(),
                      "rank_offset": 1, "world_size": world_size, "packed": False}
        return dict(self._info)

    def connect(self) -> None:
        """Join as rank 0 on this process's current GPU (vLLM's ``trainer_init``)."""
        try:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init
        except ImportError as exc:
            raise ImportError("weight sync over NCCL uses vLLM's weight-transfer API: "
                              "`pip install agentrl[gpu]` on the trainer too") from exc
        self._comm = trainer_init(self._info)

    def describe(self, bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Extra fields of a bucket's update message (none: the data is broadcast)."""
        return {}

    @property
    def stream(self) -> Any:
        """The CUDA stream the broadcasts run on: their own, never the trainer's (a
        broadcast stuck waiting for a replica must not hold the training kernels queued
        behind it)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def send(self, tensors: list[torch.Tensor]) -> None:
        """One broadcast per tensor, in order (vLLM's unpacked receiver), on the sync's
        own stream after the work that produced the tensors; returns once they are sent."""
        stream, producer = self.stream, torch.cuda.current_stream()
        stream.wait_stream(producer)
        with torch.cuda.stream(stream):
            for tensor in tensors:
                tensor = tensor.detach().to(f"cuda:{torch.cuda.current_device()}").contiguous()
                tensor.record_stream(stream)
                self._comm.broadcast(tensor, src=0, stream=stream)
        stream.synchronize()

    def abort(self) -> None:
        """Abort the communicator (``ncclCommAbort``): a broadcast stuck on the GPU exits
        instead of staying queued; the next sync builds a new group."""
        self.close()

    def close(self) -> None:
        """Destroy the communicator (vLLM's ``destroy`` aborts it)."""
        comm, self._comm = self._comm, None
        if comm is not None and hasattr(comm, "destroy"):
            comm.destroy()


class IpcSender:
    """CUDA IPC handles of each bucket, copied onto every GPU of a replica that shares
    this machine's GPUs (vLLM's ``ipc`` engine reads the handle of its own GPU)."""

    transport = "ipc"

    def __init__(self, timeout_s: float, gpus: list[int]) -> None:
        """``gpus``: the replica's GPU indices as this process sees them."""
        self.timeout_s = timeout_s
        self.gpus = gpus
        self._alive: list[torch.Tensor] = []

    def open(self, advertise_host: str, world_size: int) -> dict[str, Any]:
        """No rendezvous: only the wire format (unpacked)."""
        return {"packed": False}

    def connect(self) -> None:
        """Nothing to join."""

    def describe(self, bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """The handles of the bucket's copies, one per GPU (by GPU UUID), pickled as
        vLLM's HTTP form ``ipc_handles_pickled`` expects."""
        import base64
        import pickle

        from torch.multiprocessing.reductions import reduce_tensor

        self._alive = []
        handles = []
        for _, tensor in bucket:
            per_gpu = {}
            for gpu in self.gpus:
                copy = tensor.detach().to(f"cuda:{gpu}").contiguous()
                self._alive.append(copy)  # the replica reads it until its call returns
                uuid = str(torch.cuda.get_device_properties(gpu).uuid)
                per_gpu[uuid] = reduce_tensor(copy)[1]
            handles.append(per_gpu)
        torch.cuda.synchronize()
        return {"ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode()}

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Nothing to send: the handles are in the update message."""

    def close(self) -> None:
        """Release the last bucket's copies."""
        self._alive = []


def make_sender(transport: Transport, timeout_s: float,
                gpus: list[int] | None = None) -> GlooSender | NcclSender | IpcSender:
    """The trainer-side sender of a transport ("gloo", "nccl", "ipc" with ``gpus``)."""
    if transport == "gloo":
        return GlooSender(timeout_s)
    if transport == "nccl":
        return NcclSender(timeout_s)
    if transport == "ipc":
        return IpcSender(timeout_s, gpus or [torch.cuda.current_device()])
    raise ValueError(f'weight transport {transport!r}: use "gloo", "nccl" or "ipc"')

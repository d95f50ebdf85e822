"""The trainer's side of one replica's weight sync: vLLM's control plane + a process group.

The control plane is the four calls of vLLM's weight-transfer API
(``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``), reached over HTTP (:class:`HttpControl`: vLLM's RL routes, which
``agentrl serve`` implements too) or in process (``VLLMEngine``). :class:`CollectiveSync`
drives them and broadcasts each bucket's tensors over the data plane
(``agentrl.engines.collective``) while the replica's ``update_weights`` call receives them.
A failure or timeout on either side raises naming the replica, and the group is rebuilt on
the next sync.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
from typing import Any, Protocol

import torch

from agentrl.engines.collective import make_sender, update_info
from agentrl.engines.http import post_json_blocking, split_url
from agentrl.engines.interface import WeightSyncError
from agentrl.engines.weight_sync import in_thread
from agentrl.parallel import groups


class ControlPlane(Protocol):
    """vLLM's weight-sync control plane (its ``VLLMWeightSyncClient`` protocol)."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


class HttpControl:
    """The control plane of a server: vLLM's RL routes (``VLLM_SERVER_DEV_MODE=1``), which
    ``agentrl serve`` implements as well."""

    def __init__(self, url: str, timeout_s: float, token: str | None = None) -> None:
        """``timeout_s``: seconds each call may take; ``token``: the run's shared token
        (``agentrl.engines.auth``), sent with every call when given."""
        self.url = url
        self.timeout_s = timeout_s
        self.token = token

    def _post(self, path: str, payload: Any | None = None) -> Any:
        return post_json_blocking(self.url, path, payload, self.timeout_s, token=self.token)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Have the replica's workers join the trainer's group."""
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        """Begin a session."""
        self._post("/start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one bucket (returns once it is loaded)."""
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """End the session and set the served version."""
        self._post("/finish_weight_update", {"weight_version": weight_version})

    def world_size(self) -> int:
        """The replica's workers (tensor × pipeline parallel), as vLLM reports them."""
        answer = post_json_blocking(self.url, "/get_world_size?include_dp=false", None,
                                    self.timeout_s, method="GET", token=self.token)
        return int(answer["world_size"])


def local_address_towards(url: str, timeout_s: float = 10.0) -> str:
    """This machine's address on the route to ``url`` (what the replica can reach)."""
    host, port = split_url(url)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        return str(sock.getsockname()[0])


class CollectiveSync:
    """A ``WeightReceiver`` for one replica: control plane calls + broadcasts."""

    def __init__(self, name: str, control: ControlPlane, transport: str,
                 advertise_host: str, world_size: int, timeout_s: float,
                 gpus: list[int] | None = None) -> None:
        """``world_size``: the replica's workers (its group has one more rank, the
        trainer); ``advertise_host``: the trainer's address as the replica reaches it;
        ``gpus``: the replica's GPUs (CUDA IPC only)."""
        self.gpus = gpus
        self.name = name
        self.control = control
        self.transport = transport
        self.advertise_host = advertise_host
        self.world_size = world_size
        self.sync_timeout_s = timeout_s
        self._sender: Any = None

    def start_weight_update(self) -> None:
        """Join the group (first sync, or after a failure), then begin the session."""
        try:
            if self._sender is None:
                self._connect()
            self.control.start_weight_update()
        except BaseException:
            self.close()
            raise

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """The replica receives (control call) while the trainer broadcasts (data). Over
        NCCL the bucket waits its turn on the GPU (``groups.one_communicator_at_a_time``:
        never beside the trainer's collectives); a timeout aborts the communicator, so
        its kernel leaves the GPU, and raises naming the replica."""
        sender = self._sender
        turn = (groups.one_communicator_at_a_time(sender.stream)
                if getattr(sender, "transport", "") == "nccl" else contextlib.nullcontext())
        try:
            with turn:
                info = {**update_info(bucket), **sender.describe(bucket)}
                self._both(in_thread(self.control.update_weights, info),
                           in_thread(sender.send, [t for _, t in bucket]), "update_weights")
        except BaseException:
            self.abort()
            raise

    def finish_weight_update(self, version: int | None) -> None:
        """End the session; the replica serves ``version`` (None: it keeps its old one,
        for a session that did not send every tensor)."""
        self.control.finish_weight_update(None if version is None else str(version))

    def close(self) -> None:
        """Forget the group (the next sync builds a new one)."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()

    def abort(self) -> None:
        """After a failure: abort the data plane (an NCCL communicator's pending kernels
        exit), then forget it."""
        sender, self._sender = self._sender, None
        if sender is not None:
            getattr(sender, "abort", sender.close)()

    def _connect(self) -> None:
        sender = make_sender(self.transport, self.sync_timeout_s, self.gpus)
        init_info = sender.open(self.advertise_host, self.world_size + 1)
        self._both(in_thread(self.control.init_weight_transfer_engine, init_info),
                   in_thread(sender.connect), "init_weight_transfer_engine")
        self._sender = sender

    def _both(self, control: concurrent.futures.Future, data: concurrent.futures.Future,
              what: str) -> None:
        """Wait for the control call and the data-plane step; the first failure raises."""
        done, pending = concurrent.futures.wait(
            [control, data], timeout=self.sync_timeout_s,
            return_when=concurrent.futures.FIRST_EXCEPTION)
        for future in (control, data):
            if future in done and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        if pending:
            side = "the replica's call" if control in pending else "the broadcast"
            raise WeightSyncError(f"{what} did not finish within {self.sync_timeout_s:g} s "
                                  f"({side} is stuck); the replica's weights are undefined")

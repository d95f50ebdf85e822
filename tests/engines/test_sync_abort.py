"""A weight-sync broadcast that hangs is aborted, not abandoned, and the error names the
replica (the NCCL communicator itself is exercised by bench/gpu_acceptance.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentrl.engines.interface import WeightSyncError
from agentrl.engines.sync_client import CollectiveSync
from agentrl.engines.weight_sync import push_weights


class HangingSender:
    """A data plane whose broadcast never completes until aborted (a replica whose
    workers stopped receiving)."""

    transport = "nccl"
    stream = None

    def __init__(self) -> None:
        self.aborted = threading.Event()

    def open(self, advertise_host, world_size):
        return {}

    def connect(self) -> None:
        pass

    def describe(self, bucket):
        return {}

    def send(self, tensors) -> None:
        self.aborted.wait(30)  # stuck on the GPU until the communicator is aborted

    def abort(self) -> None:
        self.aborted.set()

    def close(self) -> None:
        raise AssertionError("a stuck broadcast must be aborted, not just forgotten")


class Control:
    def init_weight_transfer_engine(self, init_info) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info) -> None:
        time.sleep(0.05)  # the replica's side returns; the trainer's broadcast hangs

    def finish_weight_update(self, weight_version=None) -> None:
        pass


def test_a_timed_out_broadcast_aborts_its_communicator_and_names_the_replica(monkeypatch):
    sender = HangingSender()
    monkeypatch.setattr("agentrl.engines.sync_client.make_sender", lambda *a, **k: sender)
    sync = CollectiveSync("vLLM replica on GPU 1", Control(), "nccl", "127.0.0.1", 1,
                          timeout_s=0.5)
    begin = time.monotonic()
    with pytest.raises(WeightSyncError, match="weight sync to vLLM replica on GPU 1 failed "
                       "in load.*the broadcast is stuck"):
        push_weights([sync], {"w": torch.zeros(4)}, version=1)
    assert time.monotonic() - begin < 5
    assert sender.aborted.is_set()
    assert sync._sender is None  # the next sync builds a new communicator

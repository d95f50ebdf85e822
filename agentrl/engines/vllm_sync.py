"""Setting up and syncing an in-process vLLM engine (``VLLMEngine``): which
weight-transfer backend, sleep mode, GPUs.

:class:`AsyncLLMControl` is vLLM's weight-transfer control plane on ``AsyncLLM`` (driven
by ``agentrl.engines.sync_client.CollectiveSync`` together with the NCCL or gloo
broadcast). :class:`FileSync` is the fallback for vLLM builds without that API.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

BUCKET_BYTES = 512 * 2**20
"""The file fallback's scratch space must hold two buckets of this size."""


class AsyncLLMControl:
    """vLLM's weight-sync control plane on the in-process ``AsyncLLM``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        request = WeightTransferInitRequest(init_info=init_info)
        self.engine._call(self.engine._llm.init_weight_transfer_engine(request), "init")

    def start_weight_update(self) -> None:
        self.engine._call(self.engine._llm.start_weight_update(), "start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = WeightTransferUpdateRequest(update_info=update_info)
        self.engine._call(self.engine._llm.update_weights(request), "update_weights")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        llm = self.engine._llm
        self.engine._call(llm.finish_weight_update(weight_version), "finish_weight_update")
        # cached prefixes hold keys/values computed with the old weights
        self.engine._call(llm.reset_prefix_cache(), "reset_prefix_cache")


class FileSync:
    """The fallback for vLLM builds without the weight-transfer API: each bucket is a
    safetensors file in /dev/shm (or the temp dir) that the worker extension reloads.

    Tensors travel as files, not RPC arguments: vLLM's RPC path to its workers pickles
    them, which fails on the zero-copy tensors its own decoder produces."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.sync_timeout_s = engine.sync_timeout_s
        self._dir: tempfile.TemporaryDirectory | None = None
        self._count = 0

    def start_weight_update(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="agentrl-weights-", dir=scratch_dir())
        rpc = self.engine._llm.collective_rpc
        self.engine._call(rpc("agentrl_begin_reload"), "begin_reload")

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        assert self._dir is not None
        file = Path(self._dir.name) / f"bucket-{self._count}.safetensors"
        self._count += 1
        save_file({k: v.detach().to("cpu").contiguous() for k, v in bucket}, str(file))
        try:
            rpc = self.engine._llm.collective_rpc
            self.engine._call(rpc("agentrl_load_file", args=(str(file),)), "load_file")
        finally:
            file.unlink(missing_ok=True)

    def finish_weight_update(self, version: int | None) -> None:
        llm = self.engine._llm
        try:
            self.engine._call(llm.collective_rpc("agentrl_finish_reload"), "finish_reload")
            self.engine._call(llm.reset_prefix_cache(), "reset_prefix_cache")
        finally:
            if self._dir is not None:
                self._dir.cleanup()
                self._dir = None


def scratch_dir() -> str | None:
    """/dev/shm (RAM-backed) where it is writable and has room for two buckets (container
    defaults can be 64 MB), else the default temporary directory."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        return None
    return shm if shutil.disk_usage(shm).free > 2 * BUCKET_BYTES else None


def transfer_backend(weight_transport: str) -> str | None:
    """The vLLM weight-transfer backend of a transport (None: the file fallback)."""
    if weight_transport not in ("auto", "gloo", "nccl", "ipc", "files"):
        raise ValueError(f'weight_transport {weight_transport!r}: use "auto", "gloo", '
                         '"nccl", "ipc" or "files"')
    if weight_transport == "files":
        return None
    if importlib.util.find_spec("vllm.distributed.weight_transfer") is None:
        warnings.warn("this vLLM build has no weight-transfer API (vLLM >= 0.32 has it); "
                      "weights sync through files instead", stacklevel=3)
        return None
    import agentrl.engines.vllm_transfer  # noqa: F401  registers the backends here too

    if weight_transport == "auto":
        weight_transport = "nccl" if torch.cuda.is_available() else "gloo"
    return f"agentrl_{weight_transport}"


def can_sleep() -> bool:
    """Whether vLLM can sleep here (GPU builds); warns otherwise."""
    if torch.cuda.is_available():
        return True
    warnings.warn("vLLM's sleep mode needs a GPU; colocated replicas on CPU stay awake",
                  stacklevel=3)
    return False


def physical_gpus(gpus: list[int]) -> str:
    """The CUDA_VISIBLE_DEVICES value naming ``gpus`` (indices as this process sees them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else [str(i) for i in range(max(gpus) + 1)]
    return ",".join(names[g].strip() for g in gpus)


@contextlib.contextmanager
def engine_env(**values: str | None) -> Iterator[None]:
    """Environment variables set (those given as None left alone) while vLLM starts its
    processes, which inherit them: CUDA_VISIBLE_DEVICES, VLLM_ALLOW_INSECURE_SERIALIZATION."""
    before = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

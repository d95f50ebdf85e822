"""LoRA adapters in a vLLM engine: one ``LoRARequest`` per policy version.

A LoRA run's sync carries only the adapter tensors. :class:`VLLMAdapters` writes them as
a PEFT folder in a scratch directory (/dev/shm where it has room), loads it with
``AsyncLLM.add_lora(LoRARequest("policy-v<version>", version + 1, folder))`` and from then
on starts every new request with it; a request keeps the adapter it started with to its
end (vLLM's prefix cache is keyed by adapter, so no KV of another version is reused).
Versions no running request uses are removed (``remove_lora``) and their folders
deleted; vLLM holds ``max_loras`` adapters at once, which the engine sets to
``rollout.max_staleness + 2``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from agentrl.config.train_settings import LoRAConfig
from agentrl.engines.adapters import complete_update, unused_versions
from agentrl.engines.interface import WeightSyncError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed ``max_lora_rank`` values (vllm.config.lora.MaxLoRARanks)."""


def lora_engine_args(lora: LoRAConfig, max_versions: int) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` a LoRA engine needs: adapters of ``lora.rank``, up to
    ``max_versions`` of them live at once."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= lora.rank]
    if not fitting:
        raise ValueError(f"model.lora.rank = {lora.rank}: vLLM serves ranks up to "
                         f"{VLLM_LORA_RANKS[-1]}; use a lower rank")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": max_versions,
            "max_cpu_loras": max_versions}


class VLLMAdapters:
    """The adapter versions one vLLM engine serves (see the module docstring)."""

    def __init__(self, engine: Any, lora: LoRAConfig, expected: dict[str, tuple[int, ...]],
                 base_model: str) -> None:
        """``engine``: the VLLMEngine (its ``_call`` runs coroutines on vLLM's loop);
        ``expected``: adapter name → shape; ``base_model``: the folder vLLM serves."""
        from agentrl.engines.vllm_sync import scratch_dir

        self.engine = engine
        self.lora = lora
        self.expected = expected
        self.base_model = base_model
        self._dir = Path(tempfile.mkdtemp(prefix="agentrl-lora-", dir=scratch_dir()))
        self._lock = threading.Lock()
        self._requests: dict[int, Any] = {}
        """Live versions → their LoRARequest."""
        self._users: dict[int, int] = {}
        self.newest: int | None = None
        self._receiving: dict[str, torch.Tensor] | None = None

    @property
    def live(self) -> set[int]:
        """The versions loaded in vLLM."""
        with self._lock:
            return set(self._requests)

    @property
    def in_use(self) -> dict[int, int]:
        """Version → the requests running under it now (the versions no request uses are
        dropped)."""
        with self._lock:
            return {v: n for v, n in self._users.items() if n}

    def start(self) -> None:
        """Begin receiving a version (generations go on meanwhile)."""
        self._receiving = {}

    def load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Keep one bucket's adapter tensors; ValueError on a name or shape the
        configured adapter does not have."""
        if self._receiving is None:
            raise WeightSyncError(f"{self.engine.name}: load_bucket outside a weight update")
        wrong = [f"{k}: {tuple(v.shape)} != {self.expected.get(k, 'no such adapter')}"
                 for k, v in bucket if tuple(v.shape) != self.expected.get(k)]
        if wrong:
            self._receiving = None
            raise ValueError(f"{self.engine.name}: not this engine's LoRA adapters: "
                             f"{wrong[:3]}; a LoRA run sends adapter tensors only")
        self._receiving.update((k, v.detach().to("cpu", copy=True)) for k, v in bucket)

    def finish(self, version: int) -> None:
        """Write the received adapter, load it into vLLM as ``version`` and serve it to
        new requests; drop the versions nobody uses."""
        from vllm.lora.request import LoRARequest

        from agentrl.model.peft_format import save_adapter

        received, self._receiving = self._receiving, None
        received = complete_update(received, self.expected.keys(), self.engine.name)
        folder = save_adapter(self._dir / f"v{version}", received, self.lora, self.base_model)
        request = LoRARequest(f"policy-v{version}", version + 1, str(folder))
        self.engine._call(self.engine._llm.add_lora(request), "add_lora")
        with self._lock:
            self._requests[version] = request
            self.newest = version
        self._drop_unused()

    def acquire(self) -> tuple[int, Any] | tuple[None, None]:
        """(version, LoRARequest) a new request runs under: the newest (None before the
        first sync: the base model, which a fresh adapter equals)."""
        with self._lock:
            if self.newest is None:
                return None, None
            self._users[self.newest] = self._users.get(self.newest, 0) + 1
            return self.newest, self._requests[self.newest]

    def release(self, version: int | None) -> None:
        """A request of ``version`` ended."""
        if version is None:
            return
        with self._lock:
            self._users[version] -= 1
        self._drop_unused()

    def close(self) -> None:
        """Delete the scratch folders."""
        shutil.rmtree(self._dir, ignore_errors=True)

    def _drop_unused(self) -> None:
        with self._lock:
            unused = unused_versions(self._requests, self.newest,
                                     {v for v, n in self._users.items() if n})
            requests = [self._requests.pop(v) for v in unused]
            for v in unused:
                self._users.pop(v, None)
        for version, request in zip(unused, requests, strict=True):
            self.engine._call_soon(self.engine._llm.remove_lora(request.lora_int_id))
            shutil.rmtree(self._dir / f"v{version}", ignore_errors=True)

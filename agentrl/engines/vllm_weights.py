"""``VLLMEngine``'s weight sync.

Weight sync goes through vLLM's weight-transfer API (``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights`` per bucket, ``finish_weight_update`` with the
version): the trainer broadcasts each bucket over NCCL on GPUs, over gloo on CPU
(``agentrl.engines.collective``; the worker-side backends are in
``agentrl.engines.vllm_transfer``). Names and shapes are checked against the starting
checkpoint; afterwards the prefix cache is reset (no KV from old weights is reused). vLLM
builds without that API fall back to safetensors bucket files read by a worker extension
(``weight_transport = "files"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import torch

from agentrl.engines.interface import NamedTensors, WeightSyncError, next_version
from agentrl.engines.vllm_setup import LM_HEAD, _quietly


class VLLMWeightUpdates:
    """``VLLMEngine``'s weight-sync half (a mixin): the engine holds the state it reads
    (the ``AsyncLLM``, its loop, the checkpoint's shapes, the sync session)."""

    _llm: Any
    _loop: asyncio.AbstractEventLoop
    _expected_shapes: dict[str, tuple[int, ...]]
    _tied: bool
    _num_in_flight: int
    _sync: Any
    _received: set[str] | None
    adapters: Any
    name: str
    weight_version: int
    sync_timeout_s: float
    transfer_backend: str | None
    world_size: int
    gpus: list[int] | None

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *,
                       in_flight: bool = False) -> None:
        """Load new weights in place (HF names), bucket by bucket; a state dict is checked
        whole first (ValueError on unknown, missing or mis-shaped tensors, nothing sent);
        WeightSyncError when vLLM fails or times out."""
        from agentrl.engines.weight_sync import push_weights

        if isinstance(named_tensors, Mapping) and self.adapters is None:
            named_tensors = self._checked_tensors(named_tensors)
        push_weights([self], named_tensors, next_version(self.weight_version, version),
                     in_flight=in_flight)

    def start_weight_update(self, in_flight: bool = False) -> None:
        """Begin a sync session on vLLM's workers (between collections only; a LoRA
        engine's adapter sync at any time)."""
        if self.adapters is not None:
            self.adapters.start()
            return
        if self._num_in_flight:
            raise RuntimeError(
                f"{self.name}: update_weights called with {self._num_in_flight} generations "
                "in flight; sync weights between collections"
            )
        if self._sync is None:
            self._sync = self._make_sync()
        self._sync.sync_timeout_s = self.sync_timeout_s
        self._received = set()
        self._guarded(self._sync.start_weight_update)

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Check one bucket's names and shapes against the checkpoint, then send it."""
        if self.adapters is not None:
            self.adapters.load(bucket)
            return
        if self._received is None:
            raise WeightSyncError(f"{self.name}: load_bucket outside a weight update")
        bucket = [(k, v) for k, v in bucket if self._sent(k)]
        wrong = [f"{k}: {tuple(v.shape)} != {self._expected_shapes.get(k, 'no such name')}"
                 for k, v in bucket if tuple(v.shape) != self._expected_shapes.get(k)]
        if wrong:
            self._abandon()
            raise ValueError(f"{self.name}: tensors do not match the checkpoint: {wrong[:5]}; "
                             "send HF names of a model of the same size")
        if bucket:
            self._guarded(self._sync.load_bucket, bucket)
            self._received.update(k for k, _ in bucket)

    def finish_weight_update(self, version: int) -> None:
        """End the session; with every tensor received, vLLM serves ``version``."""
        if self.adapters is not None:
            self.adapters.finish(version)
            self.weight_version = version
            return
        received, self._received = self._received, None
        missing = sorted(self._expected_shapes.keys() - (received or set()))
        self._guarded(self._sync.finish_weight_update, None if missing else version)
        if missing:
            raise ValueError(f"{self.name}: the weight update lacks {len(missing)} tensors, "
                             f"e.g. {missing[:3]}; its weights are now mixed: sync again")
        self.weight_version = version

    def _make_sync(self) -> Any:
        from agentrl.engines.vllm_sync import AsyncLLMControl, FileSync

        if self.transfer_backend is None:
            return FileSync(self)
        from agentrl.engines.sync_client import CollectiveSync

        transport = self.transfer_backend.removeprefix("agentrl_")
        return CollectiveSync(self.name, AsyncLLMControl(self), transport, "127.0.0.1",
                              self.world_size, self.sync_timeout_s, self.gpus)

    def _guarded(self, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """After a failure: end the workers' session without waiting (it may be stuck
        until its own timeout) so that the next sync can start."""
        self._received = None
        if self._llm is not None:
            end = (self._llm.collective_rpc("agentrl_finish_reload")
                   if self.transfer_backend is None else self._llm.finish_weight_update())
            asyncio.run_coroutine_threadsafe(_quietly(end), self._loop)

    def _sent(self, name: str) -> bool:
        """Whether a tensor goes to vLLM (its tied models skip lm_head, and rotary
        frequencies are computed, not loaded)."""
        if name.endswith("rotary_emb.inv_freq"):
            return False
        return not (self._tied and name == LM_HEAD)

    def _checked_tensors(self, state_dict: Mapping[str, torch.Tensor]
                         ) -> dict[str, torch.Tensor]:
        """The tensors to send: HF names only, shapes as in the checkpoint, none missing."""
        tensors = {k: v for k, v in state_dict.items() if self._sent(k)}
        expected = self._expected_shapes
        unknown = sorted(tensors.keys() - expected.keys())
        missing = sorted(expected.keys() - tensors.keys())
        wrong = [
            f"{k}: {tuple(v.shape)} != {expected[k]}"
            for k, v in tensors.items()
            if k in expected and tuple(v.shape) != expected[k]
        ]
        if unknown or missing or wrong:
            raise ValueError(
                f"update_weights: the state dict does not match the engine's checkpoint: "
                f"unknown names {unknown[:5]}, missing names {missing[:5]}, shapes differ "
                f"{wrong[:5]}. Send the full state dict of a model of the same size, with "
                "Hugging Face parameter names (as save_pretrained writes them)"
            )
        return tensors

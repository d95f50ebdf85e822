"""The built-in engine's weight updates: sync sessions, sleep, LoRA adapter versions.

Weight sync is a session (``start_weight_update`` → ``load_bucket`` per bucket →
``finish_weight_update``, see ``agentrl.engines.weight_sync``): tensors are copied into
the engine's own model one bucket at a time, and the version is bumped only once every
parameter arrived. ``sleep`` frees the KV cache (the analogue of vLLM's sleep mode for a
replica colocated with training); the next request allocates it again. New weights
make every cached prefix stale: idle slots and stored prompts are forgotten, and a slot
whose cache came from older weights is never reused by a request under newer ones.

LoRA (``adapters``, ``agentrl.engines.adapters``): a sync installs a new adapter version
beside the live ones and never waits. Each request runs under the version newest at its
admission (its slot's row in the table); every prefill and decode forward runs each row
under its slot's version, every token records it, and versions no running slot uses are
dropped when requests finish.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.engines.interface import NamedTensors, WeightSyncError, next_version
from agentrl.model.prepacked import drop_prepacked
from agentrl.parallel.caches import release_cached_memory, return_freed_heap


class TorchWeightUpdates:
    """``TorchEngine``'s weight-update half (a mixin): the engine holds the state it
    reads (``model``, ``adapters``, the slot table and the running requests)."""

    model: Any
    adapters: Any
    name: str
    weight_version: int
    max_batch_size: int
    max_len: int
    _receiving: set[str] | None
    _cache: Any
    _table: Any
    _active: dict[int, Any]

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *,
                       in_flight: bool = False) -> None:
        """Copy new weights (HF names) into the model in place, bucket by bucket, and serve
        them as ``version``. Refused while requests are in flight unless ``in_flight``: an
        in-flight update (called on the engine's event loop, so between two decode steps)
        lets running requests continue under the new weights, with the KV cache their
        earlier tokens left; each token records the version it came from."""
        from agentrl.engines.weight_sync import push_weights

        push_weights([self], named_tensors, next_version(self.weight_version, version),
                     in_flight=in_flight)

    def start_weight_update(self, in_flight: bool = False) -> None:
        """Begin a sync session: between collections, or ``in_flight`` between two decode
        steps of running requests."""
        if self.adapters is not None:
            self.adapters.start()
            return
        if not in_flight:
            self._require_idle("update_weights")
        self._receiving = set()

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Copy one bucket of (name, tensor) pairs into the model's parameters (a LoRA
        engine: into the adapter version being received)."""
        if self.adapters is not None:
            self.adapters.load(bucket)
            return
        if self._receiving is None:
            raise WeightSyncError(f"{self.name}: load_bucket outside a weight update")
        targets = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in bucket:
                if name not in targets or targets[name].shape != tensor.shape:
                    got = tuple(tensor.shape)
                    want = tuple(targets[name].shape) if name in targets else "no such name"
                    raise ValueError(f"{self.name}: tensor {name} {got} does not match the "
                                     f"engine's model ({want}); send HF names of a model of "
                                     "the same size")
                targets[name].copy_(tensor)
                self._receiving.add(name)

    def finish_weight_update(self, version: int) -> None:
        """End the session: every parameter must have arrived; then serve ``version``."""
        if self.adapters is not None:
            self._finish_adapter_update(version)
            return
        received, self._receiving = self._receiving, None
        if received is None:
            raise WeightSyncError(f"{self.name}: finish without a started weight update")
        missing = sorted(n for n, _ in self.model.named_parameters() if n not in received)
        if missing:
            raise ValueError(f"{self.name}: the weight update lacks {len(missing)} "
                             f"parameters, e.g. {missing[:3]}; send every parameter")
        self.weight_version = version
        self._pack()
        if self._table is not None:  # running requests go on under the new weights
            self._table.set_version(version)
            self._table.clear_prefixes()  # cached prefixes were computed by the old ones

    def _finish_adapter_update(self, version: int) -> None:
        """Install the received adapters as ``version``, the one new requests take;
        in-flight updates (``move_running``) move running requests to it too."""
        self.adapters.finish(version, self._versions_in_use())
        self.weight_version = version
        if self._table is None:
            return
        if self.adapters.move_running:
            for request in self._active.values():
                request.version = version
            self._table.set_version(version, sorted(self._active))
        self._table.clear_prefixes()  # they hold older versions' keys/values

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (colocated with training: give the memory back); ``level``
        is accepted for symmetry with vLLM, weights stay in place."""
        self._require_idle("sleep")
        self._cache = self._table = None
        drop_prepacked(self.model)
        release_cached_memory()
        return_freed_heap()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to do: the next request allocates the KV cache again."""

    @property
    def is_sleeping(self) -> bool:
        """True while the KV cache is freed."""
        return self._cache is None

    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache takes at most (``max_batch_size`` × ``max_len``; it is
        allocated for what the admitted requests can reach and grows toward this)."""
        from agentrl.model.kv_cache import cache_dtype, kv_cache_bytes

        args = self.model.config
        dtype = cache_dtype(self.model.dtype, self.model.lm_head.weight.device)
        return kv_cache_bytes(args.num_hidden_layers, self.max_batch_size, self.max_len,
                              args.num_key_value_heads, args.head_dim, dtype.itemsize)

    def _versions_in_use(self) -> set[int]:
        return {r.version for r in self._active.values()}

    def _release_versions(self) -> None:
        """Drop the adapter versions no running request uses any more (LoRA)."""
        if self.adapters is not None:
            self.adapters.keep(self._versions_in_use())

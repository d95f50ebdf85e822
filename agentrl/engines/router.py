"""One ``InferenceEngine`` over N replicas: load-balanced, sticky per rollout, synced as one.

Routing: a request carries its rollout's key. The first request of a key goes to the
healthy replica with the fewest outstanding tokens (prompt + max new tokens of the
requests it is working on; ties go round-robin); later requests of the same key go back
to that replica, whose prefix cache holds the rollout's context. A replica that cannot be
reached is taken out of service (a warning names it; its rollouts move, the failed
request's rollout is invalid); when none is left, generation raises naming them all.

Weight sync: one pass over the trainer's (name, tensor) pairs, each bucket pushed to every
replica concurrently (``agentrl.engines.weight_sync``); the router serves the lowest
version among its replicas.

Colocated placement: ``release_memory`` puts every replica to sleep (vLLM's sleep mode;
the built-in engine frees its KV cache) so that training gets the memory back; a sync
wakes the weights first, and the next generation wakes the rest. Before any wake-up the
trainer's cached CUDA blocks go back to the driver
(``agentrl.parallel.caches.release_cached_memory``).
"""

from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.engines.http import ReplicaUnavailableError
from agentrl.engines.interface import Generation, NamedTensors, SamplingParams, next_version
from agentrl.engines.replica_figures import ReplicaFigures
from agentrl.engines.weight_sync import DEFAULT_BUCKET_BYTES, push_weights
from agentrl.parallel.caches import release_cached_memory

MAX_REMEMBERED_KEYS = 65536
"""Rollout keys whose replica is remembered (the oldest are forgotten first)."""


class NoReplicaError(RuntimeError):
    """Every replica is out of service: generation cannot continue."""


class EngineRouter:
    """Spreads requests over replicas and keeps their weights in step."""

    def __init__(self, replicas: Sequence[Any], colocated: bool = False, sleep_level: int = 1,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 weight_dtype: torch.dtype | None = None) -> None:
        """``replicas``: engines with ``generate`` and the sync session methods
        (``TorchEngine``, ``VLLMEngine``, ``RemoteEngine``); ``colocated``: they share the
        training GPUs and sleep while the trainer trains; ``weight_dtype``: the dtype
        tensors are sent in (the engines' dtype)."""
        if not replicas:
            raise ValueError("an engine router needs at least one replica")
        self.replicas = list(replicas)
        self.colocated = colocated
        self.sleep_level = sleep_level
        self.bucket_bytes = bucket_bytes
        self.weight_dtype = weight_dtype
        self.outstanding_tokens = [0] * len(self.replicas)
        self.num_requests = [0] * len(self.replicas)
        self.figures = ReplicaFigures(len(self.replicas))
        """Per-replica work since the last step (``replica_figures``)."""
        self.down: dict[int, str] = {}
        """Replicas out of service, with the reason."""
        self._home: OrderedDict[str, int] = OrderedDict()
        self._turn = itertools.count()
        self._asleep = False

    @property
    def weight_version(self) -> int:
        """The lowest version served by a replica in service."""
        return min(self.replicas[i].weight_version for i in self._healthy())

    @property
    def needs_initial_sync(self) -> bool:
        """True when some replica did not load its weights from the trainer's checkpoint
        (a server started separately): the trainer syncs before the first collection."""
        return any(getattr(r, "url", None) for r in self.replicas)

    @property
    def keeps_adapter_versions(self) -> bool:
        """True when every replica in service serves LoRA adapters by version: a sync
        may come while requests run (they finish on their adapter version)."""
        return all(getattr(self.replicas[i], "keeps_adapter_versions", False)
                   for i in self._healthy())

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Complete one prompt on the replica chosen for ``key``."""
        if self._asleep:
            self._wake(None)
        index = self.pick(key)
        cost = len(prompt_ids) + params.max_tokens
        self.outstanding_tokens[index] += cost
        self.num_requests[index] += 1
        self.figures.started(index, key, self.outstanding_tokens[index])
        generated = None
        try:
            generation = await self.replicas[index].generate(prompt_ids, params, key=key)
            generated = len(generation.token_ids)
            return generation
        except ReplicaUnavailableError as exc:
            self._take_out(index, str(exc))
            raise
        finally:
            self.outstanding_tokens[index] -= cost
            self.figures.finished(index, generated)

    def replica_figures(self) -> dict[str, float]:
        """Per replica since the last call (one step): requests, rollouts, generated tokens,
        tokens/s while busy, outstanding-token peak, served version, failures, seconds out
        of service; ``replica/<i>/<name>`` in metrics.jsonl."""
        return self.figures.take([r.weight_version for r in self.replicas])

    def pick(self, key: str | None) -> int:
        """The replica for a request: the key's home while it is in service, else the
        least loaded (outstanding tokens), ties round-robin."""
        home = self._home.get(key) if key is not None else None
        if home is not None and home not in self.down:
            self._home.move_to_end(key)  # type: ignore[arg-type]
            return home
        healthy = self._healthy()
        start = next(self._turn) % len(self.replicas)
        index = min(healthy, key=lambda i: (self.outstanding_tokens[i],
                                            (i - start) % len(self.replicas)))
        if key is not None:
            self._home[key] = index
            if len(self._home) > MAX_REMEMBERED_KEYS:
                self._home.popitem(last=False)
        return index

    def adopt_version(self, version: int) -> None:
        """Replicas that loaded the checkpoint of step ``version`` themselves serve it."""
        for replica in self.replicas:
            replica.weight_version = version

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *,
                       in_flight: bool = False) -> None:
        """Push new weights to every replica in service, bucket by bucket, in one pass;
        ``in_flight``: replicas keep their running requests (built-in replicas only)."""
        healthy = [self.replicas[i] for i in self._healthy()]
        if self._asleep:
            self._wake(["weights"])  # vLLM: weights back on the GPU, KV cache still free
        push_weights(healthy, named_tensors, next_version(self.weight_version, version),
                     self.bucket_bytes, self.weight_dtype, in_flight=in_flight)

    def release_memory(self) -> None:
        """Colocated placement: every replica sleeps until the next sync or generation."""
        if not self.colocated or self._asleep:
            return
        for i in self._healthy():
            self.replicas[i].sleep(self.sleep_level)
        self._asleep = True

    def shutdown(self) -> None:
        """Stop the replicas this process started (servers elsewhere keep running)."""
        for replica in self.replicas:
            for method in ("shutdown", "close"):
                if hasattr(replica, method):
                    getattr(replica, method)()
                    break

    def _wake(self, tags: list[str] | None) -> None:
        release_cached_memory()
        for i in self._healthy():
            self.replicas[i].wake_up(tags)
        self._asleep = tags is not None  # only a full wake-up ends the sleep

    def _healthy(self) -> list[int]:
        healthy = [i for i in range(len(self.replicas)) if i not in self.down]
        if not healthy:
            reasons = "; ".join(f"replica {i}: {why}" for i, why in self.down.items())
            raise NoReplicaError(f"every inference replica is out of service ({reasons})")
        return healthy

    def _take_out(self, index: int, reason: str) -> None:
        if index in self.down:
            return
        self.down[index] = reason
        self.figures.taken_out(index)
        warnings.warn(f"inference replica {index} taken out of service: {reason}",
                      stacklevel=3)

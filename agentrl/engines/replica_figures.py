"""Per-replica figures: how a step's generation spread over the inference replicas.

The router records every request here; :meth:`ReplicaFigures.take` returns the figures
since the previous call (one training step) as ``replica/<i>/<name>`` and starts anew.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec


class ReplicaCounts(msgspec.Struct, kw_only=True):
    """One replica's work since the last :meth:`ReplicaFigures.take`."""

    requests: int = 0
    """Completed generate calls (one per rollout turn)."""
    rollouts: int = 0
    """Distinct rollout keys it served (a rollout stays on its home replica)."""
    generated_tokens: int = 0
    """Tokens it sampled."""
    busy_s: float = 0.0
    """Seconds with at least one request in flight on it (the tokens/s denominator)."""
    outstanding_peak: int = 0
    """Most outstanding tokens (prompt + max_tokens of requests in flight) at once."""
    failures: int = 0
    """Requests that raised."""
    down_s: float = 0.0
    """Seconds out of service."""


class ReplicaFigures:
    """Counts per replica, kept by the router on its event loop. No lock: a ``take`` from
    another thread (the trainer, with the asynchronous thread collector) may move a count
    of a request ending at that moment into the next step's figures or lose it."""

    def __init__(self, num_replicas: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.counts = [ReplicaCounts() for _ in range(num_replicas)]
        self._keys: list[set[str]] = [set() for _ in range(num_replicas)]
        self._in_flight = [0] * num_replicas
        self._busy_since = [0.0] * num_replicas
        self._down_since: dict[int, float] = {}

    def started(self, index: int, key: str | None, outstanding: int) -> None:
        """A request went to replica ``index``; ``outstanding``: its tokens now in flight."""
        counts = self.counts[index]
        counts.outstanding_peak = max(counts.outstanding_peak, outstanding)
        if key is not None:
            self._keys[index].add(key)
        if self._in_flight[index] == 0:
            self._busy_since[index] = self.clock()
        self._in_flight[index] += 1

    def finished(self, index: int, generated_tokens: int | None) -> None:
        """The request ended: ``generated_tokens`` sampled, or None when it raised."""
        counts = self.counts[index]
        if generated_tokens is None:
            counts.failures += 1
        else:
            counts.requests += 1
            counts.generated_tokens += generated_tokens
        self._in_flight[index] -= 1
        if self._in_flight[index] == 0:
            counts.busy_s += self.clock() - self._busy_since[index]

    def taken_out(self, index: int) -> None:
        """Replica ``index`` left service now."""
        self._down_since.setdefault(index, self.clock())

    def take(self, versions: list[int]) -> dict[str, float]:
        """The figures since the last call (``versions``: the version each replica serves);
        then every count starts from zero."""
        now, figures = self.clock(), {}
        for index, counts in enumerate(self.counts):
            if self._in_flight[index]:  # busy across the boundary: count up to now
                counts.busy_s += now - self._busy_since[index]
                self._busy_since[index] = now
            if index in self._down_since:
                counts.down_s += now - self._down_since[index]
                self._down_since[index] = now
            counts.rollouts = len(self._keys[index])
            prefix = f"replica/{index}/"
            figures.update({prefix + name: float(value)
                            for name, value in msgspec.structs.asdict(counts).items()})
            figures[prefix + "tokens_per_s"] = (counts.generated_tokens / counts.busy_s
                                                if counts.busy_s > 0 else 0.0)
            figures[prefix + "served_version"] = float(versions[index])
            self.counts[index] = ReplicaCounts()
            self._keys[index] = set()
        return figures

"""What each rollout used of the engine: its share of the engine's busy time, its tokens.

Many rollouts' requests are in flight at once and the engine serves them together, so a
request's own wall time says little about what it cost (64 concurrent requests over 10 s
hold the engine for 10 s, not 640). :class:`EngineClock` shares time out instead: each
instant, the requests in flight split it equally. A request's charge is the integral of
``dt / n(t)`` over its lifetime; the charges of all requests add up to the seconds with at
least one request in flight, in synchronous and asynchronous collection alike. With
several replicas (the router) the clock sees them as one engine: its seconds are those
in which any replica had work.

:class:`MeteredEngine` wraps the engine for one rollout and adds every request's charge,
prompt tokens and generated tokens to that rollout's :class:`agentrl.types.Spend`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from agentrl.engines.interface import Generation, InferenceEngine, SamplingParams
from agentrl.types import Spend


class EngineClock:
    """Busy time of an engine, shared out among the requests in flight (module doc)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        """``clock``: seconds, monotonic (tests pass their own)."""
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last = clock()
        self._per_request = 0.0
        """Integral of dt / n(t) since the start, over the times with n(t) >= 1."""

    def _advance(self) -> None:
        now = self._clock()
        if self._in_flight:
            self._per_request += (now - self._last) / self._in_flight
        self._last = now

    def begin(self) -> float:
        """A request starts; returns the mark :meth:`end` charges it from."""
        with self._lock:
            self._advance()
            self._in_flight += 1
            return self._per_request

    def end(self, mark: float) -> float:
        """A request that began at ``mark`` ends; returns its share of the busy seconds."""
        with self._lock:
            self._advance()
            self._in_flight -= 1
            return self._per_request - mark


ENGINE_CLOCK = EngineClock()
"""The process's one clock: every rollout this process plays shares the same engine."""


class MeteredEngine:
    """One rollout's view of the engine: generates through it, adding each request's
    charge and tokens to ``spend``; every other attribute is the engine's own."""

    def __init__(self, engine: InferenceEngine, spend: Spend,
                 clock: EngineClock = ENGINE_CLOCK) -> None:
        """``spend``: the rollout's figures, added to in place."""
        self._engine = engine
        self._spend = spend
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        """``weight_version`` and the rest: read from the wrapped engine."""
        return getattr(self._engine, name)

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """The engine's generate, metered (a request that fails is still charged)."""
        mark = self._clock.begin()
        try:
            generation = await self._engine.generate(prompt_ids, params, key=key)
        finally:
            self._spend.generation_s += self._clock.end(mark)
            self._spend.num_prompt_tokens += len(prompt_ids)
        self._spend.num_generated_tokens += len(generation.token_ids)
        return generation

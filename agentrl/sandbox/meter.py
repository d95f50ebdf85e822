"""Seconds spent in sandboxed runs, counted for whoever asked for them.

A sandboxed run is started by an environment's tool, deep inside code that knows nothing
of rollouts. The caller that does know (the rollout side's environment guard) opens a
:func:`counting` block around each environment call; every :func:`run_python` inside it,
on the calling thread or on a thread started with a copy of its context, adds its wall
seconds to that block's :class:`Tally`. Outside any block nothing is counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Tally:
    """Seconds of sandboxed runs added up (thread-safe: tools may run on worker threads)."""

    def __init__(self) -> None:
        """Start at zero."""
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """Count ``seconds`` more."""
        with self._lock:
            self.seconds += seconds


_TALLY: ContextVar[Tally | None] = ContextVar("agentrl_sandbox_tally", default=None)


@contextmanager
def counting() -> Iterator[Tally]:
    """A fresh tally that the sandboxed runs inside this block (and the threads its context
    is copied into) add their seconds to."""
    tally = Tally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)


def add_seconds(seconds: float) -> None:
    """Count ``seconds`` of sandboxed running for the enclosing :func:`counting` block, if
    any (a worker process's own tally, sent back with its reply, arrives this way)."""
    tally = _TALLY.get()
    if tally is not None:
        tally.add(seconds)


@contextmanager
def timed_run() -> Iterator[None]:
    """Time one sandboxed run for the enclosing :func:`counting` block."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add_seconds(time.perf_counter() - start)

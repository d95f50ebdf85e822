"""Seconds counted for whoever asked for them: the sandbox's, and the same tool for others.

A sandboxed run is started by an environment's tool, deep inside code that knows nothing
of rollouts. The caller that does know (the rollout side's environment guard) opens a
``SANDBOX.counting()`` block around each environment call; every :func:`run_python`
inside it, on the calling thread or on a thread started with a copy of its context, adds
its wall seconds to that block's :class:`Tally`. Outside any block nothing is counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Tally:
    """Seconds added up (thread-safe: the work may run on other threads)."""

    def __init__(self) -> None:
        """Start at zero."""
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """Count ``seconds`` more."""
        with self._lock:
            self.seconds += seconds


class Meter:
    """Where the seconds of one kind of work go: the innermost :meth:`counting` block of
    the current context."""

    def __init__(self, name: str) -> None:
        """``name``: what it counts (for the context variable's name)."""
        self._tally: ContextVar[Tally | None] = ContextVar(f"agentrl_{name}_tally",
                                                           default=None)

    @contextmanager
    def counting(self) -> Iterator[Tally]:
        """A fresh tally that the work inside this block (and in the threads its context
        is copied into) adds its seconds to."""
        tally = Tally()
        token = self._tally.set(tally)
        try:
            yield tally
        finally:
            self._tally.reset(token)

    def current(self) -> Tally | None:
        """The tally of the enclosing block (None outside any), to hand to other threads."""
        return self._tally.get()

    def add(self, seconds: float) -> None:
        """Count ``seconds`` for the enclosing block, if any (e.g. a worker process's own
        count, sent back with its reply)."""
        tally = self._tally.get()
        if tally is not None:
            tally.add(seconds)

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count the block's wall seconds for the enclosing :meth:`counting` block."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(time.perf_counter() - start)


SANDBOX = Meter("sandbox")
"""Seconds of sandboxed runs (``run_python``)."""

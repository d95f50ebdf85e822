"""The sandboxed processes started for one environment call, stopped when the call is
abandoned.

A step runs on a thread; when it passes its deadline the rollout moves on, but Python
cannot stop the thread, which would go on through its remaining tool calls, starting a
sandbox for each. The caller that sets the deadline (the rollout side's environment guard)
runs the call inside :func:`process_scope`; every sandbox :func:`agentrl.sandbox.capture.
launch` starts there (on that thread or one started with a copy of its context) joins the
scope, and :meth:`ProcessScope.close` kills the ones alive and refuses to start more.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class ProcessScope:
    """Process groups started for one call; closed when the call is abandoned."""

    def __init__(self) -> None:
        """Open, holding nothing."""
        self.closed = False
        self._groups: set[int] = set()
        self._lock = threading.Lock()

    def started(self, pgid: int) -> bool:
        """Count a new process group; False when the scope is closed (kill it)."""
        with self._lock:
            if not self.closed:
                self._groups.add(pgid)
            return not self.closed

    def ended(self, pgid: int) -> None:
        """Forget a group; call before reaping its leader (so its id cannot be reused
        while the scope may still kill it)."""
        with self._lock:
            self._groups.discard(pgid)

    def close(self) -> None:
        """Kill every group still running and refuse new ones."""
        with self._lock:
            self.closed = True
            for pgid in self._groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass  # already gone
            self._groups.clear()


_SCOPE: ContextVar[ProcessScope | None] = ContextVar("agentrl_process_scope", default=None)


def current_scope() -> ProcessScope | None:
    """The enclosing call's scope, or None outside any."""
    return _SCOPE.get()


@contextmanager
def process_scope(scope: ProcessScope) -> Iterator[ProcessScope]:
    """Run the block (and threads started with a copy of its context) inside ``scope``."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)

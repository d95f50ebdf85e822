"""Reusable daemon threads for thread-isolated environment calls.

A new thread per call costs its start (tens of microseconds) and, when the event loop
waits for a quick call inline, a GIL hand-off back from a thread still tearing itself
down: about 0.8 ms a call on this project's CPU machine, 0.2 s of a 128-rollout step.
Threads here are kept after their call and reused, but no call ever waits for one: when
none is idle a new one starts, so a deadline still counts only the call itself. A thread
whose call hangs is simply never returned; at most ``MAX_IDLE`` idle threads are kept.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

MAX_IDLE = 256
"""Idle threads kept for reuse; one that finds the pool full ends."""


class _Worker:
    """One daemon thread running the jobs handed to it, one at a time."""

    def __init__(self, pool: ThreadPool, name: str) -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self.jobs.get()()
            if not self.pool.give_back(self):
                return


class ThreadPool:
    """Hands each call to an idle thread, or to a new one when none is idle."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0
        """Threads started so far (a figure for tests and the curious)."""

    def run(self, job: Callable[[], None], name: str) -> None:
        """Run ``job`` on a thread of its own now; ``job`` must not raise (it reports
        its outcome itself) and is expected to return."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self.started += 1
        if worker is None:
            worker = _Worker(self, f"env-call-{self.started}")
        worker.thread.name = name
        worker.jobs.put(job)

    def forget(self) -> None:
        """Drop every idle worker (in a forked child, whose copies have no threads)."""
        self._idle = []
        self._lock = threading.Lock()

    def _idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def give_back(self, worker: _Worker) -> bool:
        """A worker whose job returned: kept for the next call, or told to end."""
        with self._lock:
            if len(self._idle) >= self.max_idle:
                return False
            self._idle.append(worker)
            return True


ENV_THREADS = ThreadPool()
"""The process's pool for every thread-isolated environment call."""
os.register_at_fork(after_in_child=ENV_THREADS.forget)

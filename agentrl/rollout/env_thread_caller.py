"""Thread and inline isolation: an in-process instance's calls, each on a thread of its
own (:class:`ThreadCaller`) or on the event loop itself (:class:`InlineCaller`), under
:class:`agentrl.rollout.env_guard.GuardedEnv`'s deadlines (see that module's doc)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from agentrl.observe.profile import PROFILER
from agentrl.rollout.env_callers import (
    ENV_CALLS,
    STEP_METHODS,
    _raised,
    _settle,
    _timeout,
)
from agentrl.rollout.env_threads import ENV_THREADS
from agentrl.sandbox.scope import ProcessScope, process_scope

INLINE_WAIT_S = 0.1
"""Thread isolation: the constructor, ``reset``, ``tool_schemas`` and ``close`` are waited
for on the event loop for up to this long before the loop moves on. Quick ones then
finish in the order the rollouts started, as when they ran on the loop itself; the
built-in engine's batches, and so bit-exact resume, depend on that order."""
LATE_NOTICE_S = 0.5
"""A deadline the event loop noticed this late was passed while the call held the loop
(the GIL): the error says so."""


class ThreadCaller:
    """Runs an in-process instance's methods, each call on a new daemon thread."""

    def __init__(self, name: str, env: Any = None) -> None:
        """``env``: an existing instance, or None until :meth:`construct`."""
        self.name = name
        self.env = env
        self.stall_s = 0.0
        self._lock = threading.Lock()
        self._in_flight = False
        self._close_when_done = False

    async def construct(self, factory: Callable[[], Any], timeout_s: float) -> None:
        """Build the instance on a thread under the deadline."""
        self.env = await self._on_thread("construct", factory, (), {}, timeout_s,
                                         INLINE_WAIT_S)

    async def attribute(self, name: str, probe: bool = False) -> Any:
        """A plain attribute of the instance (``probe``: whether it has it)."""
        if probe:
            return hasattr(self.env, name)
        return getattr(self.env, name, None)

    async def call(self, method: str | Callable, args: tuple, kwargs: dict, timeout_s: float,
                   what: str | None = None) -> Any:
        """``env.method(*args, **kwargs)`` under the deadline (a top-level function is
        called as ``method(env, *args, **kwargs)``, its failures named after ``what``); a
        native ``astep`` (an override of ``AgentEnv.astep``) is awaited on the event loop
        instead of ``step``."""
        if callable(method):
            return await self._on_thread(what or method.__name__,
                                         functools.partial(method, self.env), args, kwargs,
                                         timeout_s)
        if method == "step" and (astep := _native_astep(self.env)) is not None:
            try:
                with ENV_CALLS.timed():  # it runs on the loop: its await is its time
                    return await asyncio.wait_for(astep(*args, **kwargs), timeout_s)
            except TimeoutError:
                raise _timeout(self.name, "step", timeout_s) from None
            except Exception as exc:  # noqa: BLE001 - the environment's own failure
                raise _raised(self.name, "step", exc) from None
        inline = 0.0 if method == "step" or method in STEP_METHODS else INLINE_WAIT_S
        return await self._on_thread(method, getattr(self.env, method), args, kwargs, timeout_s,
                                     inline)

    async def close(self, timeout_s: float) -> None:
        """``env.close()`` on a thread; deferred to the running thread if a call was
        abandoned and is still running (the instance must not be used concurrently)."""
        with self._lock:
            if self._in_flight:
                self._close_when_done = True
                return
        if self.env is not None and hasattr(self.env, "close"):
            await self._on_thread("close", self.env.close, (), {}, timeout_s, INLINE_WAIT_S)

    async def _on_thread(self, what: str, fn: Callable, args: tuple, kwargs: dict,
                         timeout_s: float, inline_s: float = 0.0) -> Any:
        """``fn`` on a new thread under the deadline, counted from the thread's start;
        waited for on the loop itself for up to ``inline_s`` first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        clock: dict[str, float] = {}
        box: list[tuple[bool, Any]] = []
        done = threading.Event()

        context = contextvars.copy_context()  # the caller's context, as asyncio.to_thread
        ran = ENV_CALLS.current()
        scope = ProcessScope()  # closed when the call is abandoned: its sandboxes stop

        def scoped() -> Any:
            with process_scope(scope):
                return fn(*args, **kwargs)

        def target() -> None:
            clock["start"] = time.monotonic()
            try:
                outcome: tuple[bool, Any] = (True, context.run(scoped))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome = (False, exc)
            clock["end"] = time.monotonic()
            if ran is not None:
                ran.add(clock["end"] - clock["start"])
            if PROFILER.enabled:
                PROFILER.add("rollout/env", clock["end"] - clock["start"])
            box.append(outcome)
            # no longer in flight before anyone hears of the result: a rollout that goes
            # on to close the instance must find it idle (else the close is deferred to
            # this thread, and a close that raises would go unseen)
            self._finished(what, outcome)
            try:
                loop.call_soon_threadsafe(_settle, future, outcome)
            except RuntimeError:
                pass  # the event loop is closed: nobody waits for this call any more
            done.set()  # last: a loop waiting inline resumes with nothing left to do here

        with self._lock:
            self._in_flight = True
        started = time.monotonic()
        ENV_THREADS.run(target, f"env-{self.name}-{what}")
        try:
            if done.wait(min(inline_s, timeout_s)):
                ok, value = box[0]
            else:
                ok, value = await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            late = time.monotonic() - started - timeout_s
            self.stall_s = max(self.stall_s, late)
            scope.close()
            self._abandon()
            detail = (f" (the event loop noticed {late:.1f} s after the deadline: the call "
                      "held it, and code that holds the GIL needs isolation = \"process\")"
                      if late >= LATE_NOTICE_S else "")
            error = _timeout(self.name, what, timeout_s, detail)
            error.loop_stall_s = late
            raise error from None
        except asyncio.CancelledError:
            scope.close()
            self._abandon()
            raise
        return self._outcome(what, ok, value, clock["end"] - clock["start"], timeout_s)

    def _outcome(self, what: str, ok: bool, value: Any, duration: float,
                 timeout_s: float) -> Any:
        """A finished call's value, or the EnvError it earned: its exception, or a
        deadline it passed while the event loop could not notice (holding the GIL, or
        running on the loop itself)."""
        if duration > timeout_s:
            self.stall_s = max(self.stall_s, duration - timeout_s)
            error = _timeout(self.name, what, timeout_s,
                             f" (it returned after {duration:.1f} s, holding the event loop: "
                             "code that holds the GIL needs isolation = \"process\")")
            error.loop_stall_s = duration - timeout_s
            raise error
        if not ok:
            raise _raised(self.name, what, value)
        return value

    def _abandon(self) -> None:
        with self._lock:
            if self._in_flight:
                self._close_when_done = True

    def _finished(self, what: str, outcome: tuple[bool, Any]) -> None:
        """In the call's thread: mark it done; close the instance if it was abandoned."""
        with self._lock:
            self._in_flight = False
            close = self._close_when_done
            self._close_when_done = False
        if not close:
            return
        env = outcome[1] if what == "construct" and outcome[0] else self.env
        if what != "close" and env is not None and hasattr(env, "close"):
            try:
                env.close()
            except Exception:  # noqa: BLE001 - the rollout is already invalid
                pass


class InlineCaller(ThreadCaller):
    """Runs an in-process instance's methods on the event loop itself (``isolation =
    "inline"``): no thread hand-off per call (tens of microseconds each, more on a busy
    machine), for code whose every call is quick and always returns. A deadline cannot
    cut such a call off: one that passes it is reported when it returns, as code holding
    the GIL is (``loop_stall_s``; past a second the runner moves that environment's
    later rollouts to worker processes)."""

    async def _on_thread(self, what: str, fn: Callable, args: tuple, kwargs: dict,
                         timeout_s: float, inline_s: float = 0.0) -> Any:
        """``fn`` here and now, in a copy of the caller's context (as on a thread)."""
        ran = ENV_CALLS.current()
        start = time.monotonic()
        try:
            ok, value = True, contextvars.copy_context().run(fn, *args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the environment's own failure
            ok, value = False, exc
        duration = time.monotonic() - start
        if ran is not None:
            ran.add(duration)
        if PROFILER.enabled:
            PROFILER.add("rollout/env", duration)
        return self._outcome(what, ok, value, duration, timeout_s)


def _native_astep(env: Any) -> Callable | None:
    """The instance's ``astep`` when it overrides ``AgentEnv.astep`` (native async I/O)."""
    from agentrl.envs.agent_env import AgentEnv

    astep = getattr(env, "astep", None)
    if astep is None or getattr(astep, "__func__", None) is AgentEnv.astep:
        return None
    return astep if asyncio.iscoroutinefunction(astep) else None


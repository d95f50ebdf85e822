"""Process isolation: the instance lives in a worker process
(:mod:`agentrl.rollout.env_worker`) and a call past its deadline kills the worker, whatever
the code does (see :mod:`agentrl.rollout.env_guard`)."""

from __future__ import annotations

import asyncio
import contextvars
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

from agentrl.observe.profile import PROFILER
from agentrl.rollout.env_callers import (
    ENV_CALLS,
    _called,
    _kind,
    _settle,
    _timeout,
    raised_kind,
)
from agentrl.rollout.env_contract import EnvError
from agentrl.sandbox.meter import SANDBOX
from agentrl.text import brief

START_TIMEOUT_S = 120.0
"""Seconds a worker process may take to start (not counted against any deadline: the
first start also starts the forkserver)."""


class ProcessCaller:
    """Runs the instance in a worker process; a call past its deadline kills the worker."""

    def __init__(self, name: str) -> None:
        """The worker starts in :meth:`construct`."""
        self.name = name
        self.stall_s = 0.0  # the event loop never waits on a worker
        self.process: Any = None
        self.conn: Any = None
        self._attributes: dict[str, Any] = {}

    async def construct(self, factory: Callable[[], Any], timeout_s: float) -> None:
        """Start the worker, which builds the instance with ``factory`` (it must pickle)."""
        from agentrl.rollout import env_worker

        self.factory = factory
        try:
            pickle.dumps(factory)
        except Exception as exc:  # noqa: BLE001 - a lambda or a local class
            raise EnvError("construct_raised", f"env {self.name!r}: isolation = \"process\" "
                           f"needs a factory that pickles ({exc})") from None
        ctx = env_worker.context()
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=env_worker.worker_main, args=(child, factory),
                                   name=f"env-{self.name}", daemon=True)
        await _in_thread(self.process.start)  # the first start also starts the forkserver
        child.close()
        await self._receive("construct", START_TIMEOUT_S)  # ("started",): not counted
        # the worker answers with the attributes the guard reads (env_worker.ATTRIBUTES)
        self._attributes = self._reply("construct", await self._receive("construct",
                                                                        timeout_s))

    async def attribute(self, name: str, probe: bool = False) -> Any:
        """A plain attribute read once after construction (``probe``: whether it exists)."""
        if probe:
            return name in self._attributes
        return self._attributes.get(name)

    async def call(self, method: str | Callable, args: tuple, kwargs: dict, timeout_s: float,
                   what: str | None = None) -> Any:
        """``env.method(*args, **kwargs)`` in the worker under the deadline (a top-level
        function is called as ``method(env, *args, **kwargs)``); ``what``: the method the
        failure kinds name (default: ``method``)."""
        what = what or str(method)
        if self.process is None:
            raise EnvError("worker_died", f"env {self.name!r}: its worker process is gone")
        start = time.perf_counter()
        try:
            self.conn.send((method, args, kwargs))
        except (OSError, ValueError) as exc:
            self.kill()
            raise EnvError(_kind(what, "raised"), f"env {self.name!r}: cannot reach its worker "
                           f"process ({exc})") from None
        reply = await self._receive(what, timeout_s)
        if PROFILER.enabled:  # until the worker answered (its work runs in parallel)
            PROFILER.add("rollout/env", time.perf_counter() - start)
        return self._reply(what, reply)

    async def close(self, timeout_s: float) -> None:
        """``env.close()`` in the worker, then stop it (killed if it does not finish)."""
        if self.process is None:
            return
        try:
            if "close" in self._attributes and self.process.is_alive():
                await self.call("close", (), {}, timeout_s)
        finally:
            self.kill()

    def kill(self) -> None:
        """Stop the worker now (SIGKILL) and reap it."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.is_alive():
            process.kill()
        process.join(timeout=5)
        self.conn.close()

    def _reply(self, what: str, reply: tuple) -> Any:
        if reply[0] == "ok":  # ("ok", value, sandbox seconds, call seconds): env_worker
            if len(reply) > 3:
                SANDBOX.add(reply[2])
                ENV_CALLS.add(reply[3])
            return reply[1] if len(reply) > 1 else None
        if reply[0] == "raised":
            _, type_name, message, tb, named = reply
            raise EnvError(raised_kind(what, named), f"env {self.name!r}: {_called(what)} raised "
                           f"{type_name}: {brief(message)}", tb)
        raise EnvError(_kind(what, "raised"), f"env {self.name!r}: unexpected reply {reply[0]!r}")

    async def _receive(self, what: str, timeout_s: float) -> tuple:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        fd = self.conn.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, timeout_s)
        except TimeoutError:
            loop.remove_reader(fd)  # before the pipe closes: the fd number gets reused
            self.kill()
            raise _timeout(self.name, what, timeout_s, " (its worker process was killed)") \
                from None
        except BaseException:  # cancelled: a call in flight leaves the worker unusable
            loop.remove_reader(fd)
            self.kill()
            raise
        loop.remove_reader(fd)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            code = None
            if self.process is not None:
                self.process.join(timeout=1.0)  # the pipe closed: it is exiting; reap it
                code = self.process.exitcode
            self.kill()
            raise EnvError("worker_died", f"env {self.name!r}: its worker process died "
                           f"during {_called(what)} (exit code {code})") from None


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """A blocking call on its own thread (never the shared default pool), no deadline."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    context = contextvars.copy_context()

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(fn))
        except BaseException as exc:  # noqa: BLE001
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(_settle, future, outcome)
        except RuntimeError:
            pass

    threading.Thread(target=target, daemon=True).start()
    ok, value = await future
    if not ok:
        raise value
    return value

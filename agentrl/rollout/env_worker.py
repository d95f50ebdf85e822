"""One environment instance in its own worker process (``AgentEnv.isolation = "process"``).

A step that holds the GIL (a C-level regex backtracking, a tight native loop) stalls every
thread of its process, the event loop included, so no in-process timeout can fire. In a
worker process the deadline holds: the parent waits on a pipe without blocking its event
loop and kills the worker (SIGKILL) when the deadline passes.

Protocol over one ``multiprocessing`` pipe: the worker sends ``("started",)``, builds the
environment with the pickled factory and answers ``("ok", attributes, sandbox_s, call_s)``;
then for each request ``(method, args, kwargs)`` (a method name, or a top-level function
called with the environment first) it answers ``("ok", value, sandbox_s, call_s)`` (the
seconds of its sandboxed runs and of the call itself, for the parent's cost figures) or
``("raised", type_name, message, traceback, kind)`` (``kind``: the exception's ``kind``
attribute, the named reason of a served environment's failure, else None); ``close`` is
the last request. Workers are forked from a ``forkserver`` (a clean interpreter, never a
fork of the multi-threaded trainer) and die with it, and so with the trainer.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from agentrl.sandbox.meter import SANDBOX
from agentrl.text import clip, exception_message

PRELOAD = ["__main__", "agentrl.rollout.env_worker", "agentrl.envs.registry",
           "agentrl.rollout.env_contract"]
"""Modules the forkserver imports once, so each worker starts in milliseconds. As with any
forkserver or spawn process, the program's main module is imported (once, in the
forkserver, not run: keep a script's work under ``if __name__ == "__main__":``)."""
ATTRIBUTES = ("reward_range", "tool_schemas", "close")
"""Attributes the parent reads once, sent with the answer to construction (a method is
sent as None: only its presence matters)."""
_context: Any = None


def context() -> Any:
    """The forkserver multiprocessing context, with the preloads set (once)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def worker_main(conn: multiprocessing.connection.Connection, factory: Callable[[], Any]) -> None:
    """The worker's loop: build the environment, then serve method calls until ``close``."""
    _die_with_parent()
    _release_forkserver()
    conn.send(("started",))
    try:
        env, seconds = _timed(factory)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised here
        _send(conn, _failure(exc))
        return
    _send(conn, ("ok", {name: None if callable(getattr(env, name)) else getattr(env, name)
                        for name in ATTRIBUTES if hasattr(env, name)}, *seconds))
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        try:
            fn = getattr(env, method) if isinstance(method, str) else functools.partial(method,
                                                                                       env)
            value, seconds = _timed(functools.partial(fn, *args, **kwargs))
            reply = ("ok", value, *seconds)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            reply = _failure(exc)
        _send(conn, reply)
        if method == "close":
            return


def _timed(fn: Callable[[], Any]) -> tuple[Any, tuple[float, float]]:
    """``fn()``, and the seconds the parent's guard counts for it: (its sandboxed runs,
    the call itself)."""
    start = time.perf_counter()
    with SANDBOX.counting() as sandbox:
        value = fn()
    return value, (sandbox.seconds, time.perf_counter() - start)


def _failure(exc: BaseException) -> tuple[str, str, str, str, str | None]:
    kind = getattr(exc, "kind", None)
    return ("raised", type(exc).__name__, clip(exception_message(exc), 2000),
            "".join(traceback.format_exception(exc)), kind if isinstance(kind, str) else None)


def _send(conn: multiprocessing.connection.Connection, reply: tuple) -> None:
    try:
        conn.send(reply)
    except (EOFError, OSError):
        pass  # the parent is gone
    except Exception as exc:  # noqa: BLE001 - e.g. a return value that cannot be pickled
        conn.send(("raised", type(exc).__name__,
                   f"its return value cannot be sent from the worker process: {exc}",
                   "".join(traceback.format_exception(exc)), None))


def _release_forkserver() -> None:
    """Close this worker's copy of the forkserver's "alive" pipe. The forkserver exits
    when every holder has closed it; workers hold a copy by default, so one stuck in C
    code (the GIL held) would keep the forkserver, and so itself, alive after the trainer
    died. Without the copy, the trainer's death ends the forkserver, and the
    parent-death signal then kills the worker. (A private attribute: where it is
    missing, a stuck worker only outlives the trainer until its call returns.)"""
    from multiprocessing import forkserver

    fd = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent (the forkserver) exits."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the worker still exits when its pipe closes

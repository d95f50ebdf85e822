"""Every call into an environment under containment: a deadline, a checked result.

:class:`GuardedEnv` is how the rollout code talks to an environment. ``reset``,
``tool_schemas``, ``needed_facts``, ``step`` and ``close`` each run under the deadline
``rollout.step_timeout_s``, the constructor under its own (the runner gives it
``rollout.rollout_timeout_s``: loading data may take longer than a step); what they
return is checked against the contract (:mod:`agentrl.rollout.env_contract`); any
failure becomes an :class:`EnvError` with a named kind, which invalidates that rollout
and nothing else.

Three ways to run the environment (``AgentEnv.isolation``):

- ``"thread"`` (default): the instance lives in this process; each call runs on a thread
  of its own (reused from call to call, :mod:`agentrl.rollout.env_threads`). No call ever
  waits for a free worker, so the deadline counts only the call itself (never queueing),
  and a call abandoned at its deadline blocks no one; when it finally returns, its
  thread closes the instance. A Python-level hang is cut off on time. Code that holds
  the GIL (C code such as a backtracking regex) stalls the whole process, event loop
  included: the call is then reported late (``step_timeout`` with its real duration)
  and ``loop_stall_s`` says how long the loop was frozen.
- ``"inline"``: the instance lives in this process and each call runs on the event loop
  itself (:class:`InlineCaller`): no hand-off to a thread, for environments whose every
  call is quick pure Python that always returns (task generation and grading, like the
  built-in Countdown and Calculator). A call past its deadline is reported when it
  returns, as above; a call that never returns would freeze the run.
- ``"process"``: the instance lives in a worker process (:mod:`agentrl.rollout.env_worker`)
  and the deadline holds whatever the code does: the worker is killed at the deadline.
  Each instance costs a forked process (milliseconds) and its results are pickled.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentrl.envs.adapters.remote import REMOTE_KINDS
from agentrl.observe.profile import PROFILER
from agentrl.rollout.env_contract import (
    EnvError,
    StepResult,
    check_info,
    check_needed_facts,
    check_reset,
    check_reward,
    check_step,
    check_subagent_step,
    check_tool_schemas,
    describe,
    finite_float,
)
from agentrl.rollout.env_threads import ENV_THREADS
from agentrl.sandbox.meter import SANDBOX, Meter
from agentrl.sandbox.scope import ProcessScope, process_scope
from agentrl.text import brief, exception_message
from agentrl.types import MAIN_THREAD, Message, Spend

ISOLATIONS = ("thread", "inline", "process")
INLINE_WAIT_S = 0.1
"""Thread isolation: the constructor, ``reset``, ``tool_schemas`` and ``close`` are waited
for on the event loop for up to this long before the loop moves on. Quick ones then
finish in the order the rollouts started, as when they ran on the loop itself; the
built-in engine's batches, and so bit-exact resume, depend on that order."""
LATE_NOTICE_S = 0.5
"""A deadline the event loop noticed this late was passed while the call held the loop
(the GIL): the error says so."""
ENV_CALLS = Meter("env_calls")
"""Seconds the environment's code ran, counted where it runs (``GuardedEnv.env_s``)."""
START_TIMEOUT_S = 120.0
"""Seconds a worker process may take to start (not counted against any deadline: the
first start also starts the forkserver)."""


class GuardedEnv:
    """One environment instance behind deadlines and contract checks (see module doc)."""

    def __init__(self, name: str, caller: Any, timeout_s: float,
                 max_observation_chars: int) -> None:
        """Use :meth:`open` (build under containment) or :meth:`wrap` (an existing instance)."""
        self.name = name
        self.caller = caller
        self.timeout_s = timeout_s
        self.max_observation_chars = max_observation_chars
        self.reward_range: tuple[float, float] | None = None
        self.thread_ids: set[str] = set()
        """Subagent threads the environment started (their ids must be new)."""
        self._steps = asyncio.Lock()
        """One step at a time: a rollout's threads share the instance (and its worker)."""
        self.env_s = 0.0
        """Seconds the environment's code ran in every call so far, construction included
        (``Spend.env_s``; see :meth:`_timed`)."""
        self.sandbox_s = 0.0
        """Seconds of sandboxed runs inside those calls (``Spend.sandbox_s``)."""

    @classmethod
    async def open(cls, name: str, factory: Callable[[], Any], timeout_s: float,
                   max_observation_chars: int, isolation: str = "thread",
                   construct_timeout_s: float | None = None) -> GuardedEnv:
        """Build the environment with ``factory()`` (in a worker process when
        ``isolation == "process"``) under ``construct_timeout_s`` (default: ``timeout_s``,
        the deadline of every later call); raises EnvError."""
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation {isolation!r}; use one of {ISOLATIONS}")
        callers = {"thread": ThreadCaller, "inline": InlineCaller, "process": ProcessCaller}
        caller = callers[isolation](name)
        guarded = cls(name, caller, timeout_s, max_observation_chars)
        with guarded._timed():
            await caller.construct(factory, construct_timeout_s or timeout_s)
        guarded.reward_range = await caller.attribute("reward_range")
        return guarded

    @classmethod
    def wrap(cls, name: str, env: Any, timeout_s: float,
             max_observation_chars: int) -> GuardedEnv:
        """Guard an instance that already exists (in this process, thread isolation)."""
        guarded = cls(name, ThreadCaller(name, env), timeout_s, max_observation_chars)
        guarded.reward_range = getattr(env, "reward_range", None)
        return guarded

    async def _call(self, method: str | Callable, args: tuple, kwargs: dict,
                    what: str | None = None) -> Any:
        """One call under the deadline, timed."""
        with self._timed():
            return await self.caller.call(method, args, kwargs, self.timeout_s, what)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Add the seconds the environment's code ran inside the block (timed where it
        runs: on its thread, in its worker, or the await of a native ``astep``) and the
        sandbox seconds within them to the instance's. Never the time the event loop took
        to notice the call was done: with a busy loop that is no cost of the environment.
        A call that fails counts at least the time waited for it (a timeout: its
        deadline)."""
        start = time.perf_counter()
        with SANDBOX.counting() as sandbox, ENV_CALLS.counting() as ran:
            try:
                yield
            except BaseException:
                self.env_s += max(ran.seconds, time.perf_counter() - start)
                raise
            else:
                self.env_s += ran.seconds
            finally:
                self.sandbox_s += sandbox.seconds

    def record_time(self, spend: Spend) -> None:
        """Put the seconds of every call so far into a rollout's ``spend``."""
        spend.env_s, spend.sandbox_s = self.env_s, self.sandbox_s

    @property
    def loop_stall_s(self) -> float:
        """Longest time a call of this instance kept running past its deadline while the
        event loop could not notice (a call holding the GIL); 0.0 when none did."""
        return self.caller.stall_s

    async def reset(self, seed: int | None, options: dict | None = None) -> list[Message]:
        """The task's messages, checked."""
        kwargs: dict[str, Any] = {"seed": seed}
        if options is not None:
            kwargs["options"] = options
        result = await self._call("reset", (), kwargs)
        messages, _ = check_reset(self.name, result, self.max_observation_chars)
        self.thread_ids.clear()  # a new episode numbers its threads afresh
        return messages

    async def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools offered (empty when the environment has no ``tool_schemas``), checked."""
        if not await self.caller.attribute("tool_schemas", probe=True):
            return []
        schemas = await self._call("tool_schemas", (), {})
        return check_tool_schemas(self.name, schemas)

    async def needed_facts(self) -> list[str]:
        """What the current task's answer needs from the conversation (empty when the
        environment does not say), checked."""
        if not await self.caller.attribute("needed_facts", probe=True):
            return []
        facts = await self._call("needed_facts", (), {})
        return check_needed_facts(self.name, facts)

    async def step(self, action: str) -> StepResult:
        """One step, checked: a real list, a finite reward, two bools, a dict (and any
        subagent calls it asks for, ``info["subagent_calls"]``)."""
        return await self._step("step", MAIN_THREAD, (action,))

    async def thread_step(self, thread_id: str, action: str) -> StepResult:
        """One turn of a subagent thread (``agentrl.envs.subagents``), checked like a step;
        its reward must be 0.0."""
        return await self._step("thread_step", thread_id, (thread_id, action))

    async def complete_step(self, thread_id: str, results: list[Any]) -> StepResult:
        """Hand a waiting step its subagents' results; the step's result, checked."""
        return await self._step("complete_step", thread_id, (thread_id, results))

    async def _step(self, method: str, thread_id: str, args: tuple) -> StepResult:
        async with self._steps:
            result = await self._call(method, args, {})
        reward_range = _range(self.reward_range) if thread_id == MAIN_THREAD else None
        checked = check_step(self.name, result, self.max_observation_chars, reward_range,
                             method)
        check_subagent_step(self.name, checked, method, thread_id, self.thread_ids,
                            self.max_observation_chars)
        return checked

    async def grade(self, final: str, grader: str = "") -> tuple[float, dict[str, float]]:
        """An agent program's final answer graded (``agentrl.envs.harness.grade_final``),
        checked: a finite reward and named finite components."""
        from agentrl.envs.harness import grade_final

        reward, components = await self._call(grade_final, (final, grader), {}, "grade")
        if finite_float(reward) is None:
            raise EnvError("bad_reward", f"env {self.name!r}: grading the final answer gave "
                           f"reward {describe(reward)}; expected a finite float")
        value = check_reward(self.name, reward, _range(self.reward_range))
        info = check_info(self.name, "grade", {"reward_components": components})
        return value, dict(info["reward_components"])

    async def close(self) -> None:
        """Close the instance (deferred to its thread while an abandoned call still runs)."""
        with self._timed():
            await self.caller.close(self.timeout_s)


def _range(value: Any) -> tuple[float, float] | None:
    if isinstance(value, tuple | list) and len(value) == 2:
        return float(value[0]), float(value[1])
    return None


def _raised(name: str, what: str, exc: BaseException, tb: str | None = None) -> EnvError:
    return EnvError(raised_kind(what, getattr(exc, "kind", None)),
                    f"env {name!r}: {_called(what)} raised {type(exc).__name__}: "
                    f"{brief(exception_message(exc))}",
                    tb or "".join(traceback.format_exception(exc)))


STEP_METHODS = ("thread_step", "complete_step")
"""The subagent protocol's methods (``agentrl.envs.subagents``): their failures count as
``step_raised`` / ``step_timeout``, the message names the method."""


def _kind(what: str, outcome: str) -> str:
    """The invalid kind of a call's failure: ``<method>_raised`` or ``<method>_timeout``."""
    return f"{'step' if what in STEP_METHODS else what}_{outcome}"


def raised_kind(what: str, named: Any) -> str:
    """The kind of an exception raised by ``what``: the reason a served environment's
    error names (:data:`agentrl.envs.adapters.remote.REMOTE_KINDS`), else
    ``<method>_raised``."""
    return named if named in REMOTE_KINDS else _kind(what, "raised")


def _called(what: str) -> str:
    return "the constructor" if what == "construct" else f"{what}()"


def _timeout(name: str, what: str, timeout_s: float, detail: str = "") -> EnvError:
    return EnvError(_kind(what, "timeout"),
                    f"env {name!r}: {_called(what)} timed out: no return within "
                    f"{timeout_s:g} s{detail}")


# --------------------------------------------------------------------------- threads


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


def _settle(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(outcome)


def _native_astep(env: Any) -> Callable | None:
    """The instance's ``astep`` when it overrides ``AgentEnv.astep`` (native async I/O)."""
    from agentrl.envs.agent_env import AgentEnv

    astep = getattr(env, "astep", None)
    if astep is None or getattr(astep, "__func__", None) is AgentEnv.astep:
        return None
    return astep if asyncio.iscoroutinefunction(astep) else None


# --------------------------------------------------------------------------- processes


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

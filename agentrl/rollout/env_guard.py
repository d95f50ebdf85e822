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
  of its own (:mod:`agentrl.rollout.env_thread_caller`; the threads are reused from call
  to call, :mod:`agentrl.rollout.env_threads`). No call ever waits for a free worker, so
  the deadline counts only the call itself (never queueing), and a call abandoned at its
  deadline blocks no one; when it finally returns, its thread closes the instance. A
  Python-level hang is cut off on time. Code that holds the GIL (C code such as a
  backtracking regex) stalls the whole process, event loop included: the call is then
  reported late (``step_timeout`` with its real duration) and ``loop_stall_s`` says how
  long the loop was frozen.
- ``"inline"``: the instance lives in this process and each call runs on the event loop
  itself (:class:`~agentrl.rollout.env_thread_caller.InlineCaller`): no hand-off to a
  thread, for environments whose every call is quick pure Python that always returns
  (task generation and grading, like the built-in Countdown and Calculator). A call past
  its deadline is reported when it returns, as above; a call that never returns would
  freeze the run.
- ``"process"``: the instance lives in a worker process (:mod:`agentrl.rollout.env_worker`,
  driven by :mod:`agentrl.rollout.env_process_caller`) and the deadline holds whatever the
  code does: the worker is killed at the deadline. Each instance costs a forked process
  (milliseconds) and its results are pickled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentrl.rollout.env_callers import ENV_CALLS
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
from agentrl.rollout.env_process_caller import ProcessCaller
from agentrl.rollout.env_thread_caller import InlineCaller, ThreadCaller
from agentrl.sandbox.meter import SANDBOX
from agentrl.types import MAIN_THREAD, Message, Spend

ISOLATIONS = ("thread", "inline", "process")


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

"""Environments that break the contract in every way a careless user's might (issue #13).

``BrokenEnv(mode)`` is a duck-typed stand-in (like ``stand_ins.LongEnv``) whose first step
or other method misbehaves as ``mode`` says. The ``AgentEnv`` subclasses at the bottom are
importable by path (``tests.rollout.broken_envs:GilEnv``) for process isolation.
"""

from __future__ import annotations

import os
import re
import time

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task
from agentrl.types import Message

OK_STEP = ([], 1.0, True, False, {})

STEP_RESULTS = {
    "reward_none": ([], None, True, False, {}),
    "reward_high": ([], "high", True, False, {}),
    "reward_numeric_string": ([], "1.0", True, False, {}),
    "reward_nan": ([], float("nan"), True, False, {}),
    "reward_inf": ([], float("inf"), True, False, {}),
    "reward_out_of_range": ([], 5.0, True, False, {}),
    "observation_str": ("hello", 0.0, False, False, {}),
    "observation_int": (3, 0.0, False, False, {}),
    "observation_surrogate": ([Message("tool", "echo \ud800", "echo")], 0.0, False, False, {}),
    "observation_10mb": ([Message("tool", "x" * 10_000_000, "dump")], 0.0, False, False, {}),
    "four_tuple": ([], 1.0, True, {}),
    "info_none": ([], 1.0, True, False, None),
    "terminated_int": ([], 1.0, 1, False, {}),
}
"""What ``step`` returns, by mode."""


class BrokenEnv:
    """One task, one step; misbehaves as ``mode`` says (see STEP_RESULTS and below)."""

    reward_range = (0.0, 1.0)

    def __init__(self, mode: str = "fine") -> None:
        self.mode = mode
        self.closed = False

    def tool_schemas(self) -> list[dict]:
        if self.mode == "tool_schemas_raises":
            raise RuntimeError("schemas broke")
        if self.mode == "tool_schemas_not_json":
            return [{"type": "function", "function": {"name": "f", "parameters": {1, 2}}}]
        return []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.mode == "slow_reset":
            time.sleep(2.0)
        if self.mode == "reset_str":
            return "the task", {}
        return [Message("user", f"task {seed}")], {}

    def step(self, action: str):
        if self.mode == "step_raises":
            raise RuntimeError("tool crashed")
        return STEP_RESULTS.get(self.mode, OK_STEP)

    def close(self) -> None:
        self.closed = True
        if self.mode == "close_raises":
            raise OSError("close failed")


def make_broken(mode: str) -> BrokenEnv:
    """A BrokenEnv, or a constructor that raises for mode "constructor_raises"."""
    if mode == "constructor_raises":
        raise ValueError("bad constructor argument")
    if mode == "slow_constructor":
        time.sleep(2.0)
    return BrokenEnv(mode)


class _OneStep(AgentEnv):
    """An AgentEnv with one task per seed; subclasses misbehave in step."""

    def sample_task(self, rng: np.random.Generator) -> Task:
        n = int(rng.integers(1_000_000))
        return Task([Message("user", f"task {n}")], answer=n, key=str(n))

    def grade(self, answer: str) -> Grade:
        return Grade(1.0)


def _hold_the_gil(length: int) -> None:
    """C-level backtracking: the GIL is held throughout (about 1.5 s at 24, x2 per +1)."""
    re.match(r"(a+)+$", "a" * length + "b")


class GilEnv(_OneStep):
    """A step that holds the GIL for about 10 s, in a worker process."""

    isolation = "process"

    def step(self, action: str):
        _hold_the_gil(27)
        return super().step(action)


class StuckEnv(_OneStep):
    """A step stuck in C code for minutes (the GIL held), in a worker process."""

    isolation = "process"

    def step(self, action: str):
        _hold_the_gil(32)
        return super().step(action)


class GilInThreadEnv(_OneStep):
    """A step that holds the GIL for about 6 s (3 s on a machine twice as fast), in the
    trainer's process."""

    def step(self, action: str):
        _hold_the_gil(26)
        return super().step(action)


class CrashEnv(_OneStep):
    """A step that kills its process outright (as a segfault in a C extension would)."""

    isolation = "process"

    def step(self, action: str):
        os._exit(3)


class ProcessHighRewardEnv(_OneStep):
    """Returns reward "high", from a worker process."""

    isolation = "process"

    def step(self, action: str):
        super().step(action)
        return [], "high", True, False, {}


class ProcessFineEnv(_OneStep):
    """Well-behaved, in a worker process."""

    isolation = "process"


class SlowStepEnv(_OneStep):
    """A step that sleeps for a minute."""

    def step(self, action: str):
        time.sleep(60)
        return super().step(action)


class EndlessEnv(_OneStep):
    """Never terminates nor truncates."""

    def step(self, action: str):
        return [Message("tool", "again", "echo")], 0.0, False, False, {}


class NaiveGraderEnv(_OneStep):
    """A grader that assumes replies are short: it raises on any over 10,000 characters."""

    def grade(self, answer: str) -> Grade:
        if len(answer) > 10_000:
            raise ValueError(f"answer of {len(answer)} characters")
        return Grade(1.0)

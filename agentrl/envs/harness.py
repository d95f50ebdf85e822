"""Agent programs as environments (docs/harnesses.md): what the program is handed and
how its final answer is graded.

A harness environment is an ordinary ``[[environments]]`` entry with a ``harness``
section: its ``id`` (any ``AgentEnv``) gives the tasks (``reset``) and grades the final
answer (``grade``, or the section's ``grader``); the program, a Python callable
``run(task, client_config) -> str`` or a command line, plays the task by calling the
OpenAI-compatible endpoint. The rollout side (``agentrl.rollout.harness``) runs it under
deadlines; this module holds the parts that run where the program or the environment
runs (a thread or a worker process), so they are top-level and pickle.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from agentrl.envs.registry import load_object
from agentrl.envs.task import Grade

PYTHON_NAMES = ("python", "python3")
"""A command's first word that means the interpreter agentrl runs in."""


def own_python(argv: Sequence[str]) -> list[str]:
    """``argv`` with a leading ``python`` / ``python3`` replaced by the interpreter agentrl
    runs in (``sys.executable``): the one rule for every command agentrl starts
    (``harness.command``, an OpenEnv server's ``command``), so a program sees the packages
    agentrl sees, whatever ``python`` the PATH would find."""
    argv = [str(a) for a in argv]
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


class HarnessProgram:
    """A user's callable, loaded where it runs; ``harness`` is the one method called."""

    def __init__(self, run: str) -> None:
        """``run``: "file.py:function" or "package.module:function"."""
        self.function = load_object(run, "harness.run")
        if not callable(self.function):
            raise ValueError(f"harness.run = {run!r} is not callable; it must be a function "
                             "run(task, client_config) -> str")

    def harness(self, task: dict[str, Any], client_config: dict[str, Any]) -> Any:
        """Play one task; returns the program's final answer."""
        return self.function(task, client_config)


def play_task(program: HarnessProgram, task: dict[str, Any],
              client_config: dict[str, Any]) -> Any:
    """``program.harness(task, client_config)``, as a top-level function (it pickles, for
    a program in a worker process)."""
    return program.harness(task, client_config)


def grade_final(env: Any, final: str, grader: str = "") -> tuple[Any, dict[str, float]]:
    """(reward, components) of a final answer: ``grader(env.task, final)`` when a grader
    is named, else the environment's own ``grade(final)``. Runs in the environment's
    thread or worker process (the caller checks the reward)."""
    if grader:
        result = load_object(grader, "harness.grader")(env.task, final)
    else:
        result = env.grade(final)
    if isinstance(result, Grade):
        return result.reward, dict(result.components)
    return result, {}

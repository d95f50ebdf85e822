"""What every environment caller shares: the meter of the environment's own seconds and
the errors a failed call earns (``<method>_raised`` / ``<method>_timeout``).

The callers themselves: :mod:`agentrl.rollout.env_thread_caller` (thread and inline
isolation) and :mod:`agentrl.rollout.env_process_caller` (process isolation); both serve
:class:`agentrl.rollout.env_guard.GuardedEnv`.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from agentrl.envs.adapters.remote import REMOTE_KINDS
from agentrl.rollout.env_contract import EnvError
from agentrl.sandbox.meter import Meter
from agentrl.text import brief, exception_message

ENV_CALLS = Meter("env_calls")
"""Seconds the environment's code ran, counted where it runs (``GuardedEnv.env_s``)."""


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




def _settle(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(outcome)

"""One rollout in a fresh environment instance, contained from construction to close.

The runner and validation play every rollout through :func:`play_episode`: every method
and ``close`` run under ``rollout.step_timeout_s``, the constructor under
``rollout.rollout_timeout_s`` (in a worker
process when the environment's class sets ``isolation = "process"``), and any failure
invalidates that rollout with a named kind, reported to an optional callback with its
traceback. Nothing an environment does reaches the caller as an exception.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.engines.interface import InferenceEngine
from agentrl.rollout.env_contract import EnvError
from agentrl.rollout.env_guard import ISOLATIONS, GuardedEnv
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.types import Rollout, RolloutStats

OnFailure = Callable[[RolloutSpec, EnvError], None]


class EnvSource(NamedTuple):
    """How to build one environment instance: its name, a factory, where it runs."""

    name: str
    factory: Callable[[], Any]
    """Builds an instance; must pickle (a top-level function, or a partial of one) for
    process isolation."""
    isolation: str = "thread"
    """"thread" or "process" (see :mod:`agentrl.rollout.env_guard`)."""
    harness: Any = None
    """A ``HarnessConfig``: an agent program plays the task through the endpoint (the
    environment gives the task and grades); None: the built-in multi-turn loop."""


def isolation_of(env_id: str) -> str:
    """The ``isolation`` its class asks for ("thread" when it names none or the id does
    not resolve: the constructor then fails, contained, where it runs)."""
    import gymnasium

    from agentrl.envs.registry import resolve

    try:
        target = resolve(env_id)
        if isinstance(target, str):
            entry = gymnasium.spec(target).entry_point
            target = gymnasium.envs.registration.load_env_creator(entry) if isinstance(
                entry, str) else entry
    except Exception:  # noqa: BLE001 - an unknown or broken id fails at construction
        return "thread"
    isolation = getattr(target, "isolation", "thread")
    return isolation if isolation in ISOLATIONS else "thread"


CURRENT_ROLLOUT: contextvars.ContextVar[RolloutSpec] = contextvars.ContextVar(
    "agentrl_current_rollout")
"""The rollout being played in this asyncio task (and in the threads its environment calls
run on): lets a custom ``make_env`` know which rollout it builds an instance for."""


async def play_episode(
    spec: RolloutSpec, source: EnvSource, engine: InferenceEngine, tokenizer: Any,
    rollout: RolloutConfig, compaction: CompactionConfig, on_failure: OnFailure | None = None,
    endpoint: Any = None,
) -> Rollout:
    """Build, play and close one instance; every failure gives an invalid rollout.
    ``endpoint``: the run's ``HarnessEndpoint``, for sources with a ``harness``."""
    CURRENT_ROLLOUT.set(spec)
    start = time.perf_counter()
    try:
        env = await GuardedEnv.open(source.name, source.factory, rollout.step_timeout_s,
                                    rollout.max_observation_chars, source.isolation,
                                    construct_timeout_s=rollout.rollout_timeout_s)
    except EnvError as exc:
        failed = _failed_before_start(spec, exc, on_failure)
        failed.stats.spend.env_s = time.perf_counter() - start  # the failed construction
        return failed
    try:
        if source.harness is None:
            result = await play_rollout(spec, env, engine, tokenizer, rollout, compaction,
                                        on_failure)
        else:
            result = await _play_harness(spec, env, source.harness, endpoint, rollout,
                                         on_failure)
    finally:
        try:
            await env.close()
            closed: EnvError | None = None
        except EnvError as exc:
            closed = exc
    env.record_time(result.stats.spend)  # construction to close
    if closed is not None and result.valid:  # a close failure is the rollout's only fault
        result.valid = False
        result.stats.error, result.stats.error_kind = str(closed), closed.kind
        if on_failure is not None:
            on_failure(spec, closed)
    return result


async def _play_harness(spec: RolloutSpec, env: GuardedEnv, harness: Any, endpoint: Any,
                        rollout: RolloutConfig, on_failure: OnFailure | None) -> Rollout:
    from agentrl.rollout.harness_episode import play_harness_rollout

    result, failure = await play_harness_rollout(spec, env, harness, endpoint, rollout)
    if failure is not None and on_failure is not None:
        on_failure(spec, failure)
    return result


def _failed_before_start(spec: RolloutSpec, exc: EnvError,
                         on_failure: OnFailure | None) -> Rollout:
    if on_failure is not None:
        on_failure(spec, exc)
    return Rollout(rollout_id=spec.rollout_id, group_id=spec.group_id, env=spec.env,
                   segments=[], reward=0.0, valid=False,
                   stats=RolloutStats(error=str(exc), error_kind=exc.kind))

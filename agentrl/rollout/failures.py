"""The failure taxonomy: each way a rollout can fail has one class, and each class one rule.

Every invalid kind (:data:`agentrl.rollout.env_contract.INVALID_KINDS`) and every
truncation reason (:data:`agentrl.types.TRUNCATION_REASONS`) belongs to one class
(:data:`agentrl.rollout.env_contract.FAILURE_CLASSES`, :data:`POLICY_TRUNCATIONS`):

- **infrastructure** (a server unreachable or full, a disconnect, a worker that died, an
  engine replica out of service, a constructor or reset that raised, and any failure
  before the policy generated a token): the rollout is *retried* from its task with a
  fresh environment instance, same task, same group, a new rollout id
  (``<id>-retry<n>``, ``Rollout.retry_of`` naming the first), up to
  ``rollout.max_retries`` times. Failures independent of the task then leave every group
  full and the estimate unbiased. Only when the retries run out is it masked and counted,
  with a warning naming the task (a task that always breaks its server is said so by
  name, never learned to avoid).
- **policy** (a runaway past ``rollout.max_rollout_tokens``, a compaction that could not
  keep the context in budget, more malformed calls than ``rollout.max_tool_errors``, an
  agent program over its own budget): a *trained outcome*, never masked, with the
  environment's reward, or the fixed reward ``rollout.failure_rewards[kind]``.
- **ambiguous** (a step that raised or timed out, a contract broken after an action, a
  rollout timeout: the policy's action may or may not have caused it): *masked* and
  counted; ``rollout.ambiguous_failures`` moves the class to either side ("retry" or
  "keep").

Counts: per collection and environment, retries by kind, masked rollouts by kind
(``invalid/<kind>``) and kept ones by kind (``kept/<kind>``), see ``failure_figures``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.rollout.env_contract import FAILURE_CLASSES
from agentrl.types import Rollout

INFRASTRUCTURE, POLICY, AMBIGUOUS = "infrastructure", "policy", "ambiguous"
FAILURE_CLASS_NAMES = (INFRASTRUCTURE, POLICY, AMBIGUOUS)

POLICY_TRUNCATIONS = ("max_rollout_tokens", "context_budget", "max_compactions",
                      "tool_errors")
"""Truncation reasons that are policy-caused failures: trained, with the environment's
reward or ``rollout.failure_rewards[reason]``. The other truncations (``max_turns``,
``env``) are ordinary ends of an episode."""

NEVER_KEPT = ("row_too_long",)
"""Ambiguous kinds masked even with ``ambiguous_failures = "keep"``: their rows were cut
to fit the micro-batch budget, so what is left is not what the policy generated."""

KEEPABLE = (*POLICY_TRUNCATIONS,
            *(k for k, c in FAILURE_CLASSES.items() if c != INFRASTRUCTURE))
"""The kinds ``rollout.failure_rewards`` may name: policy-caused ones, and ambiguous ones
(used with ``ambiguous_failures = "keep"``)."""

CLEAN, RETRY, KEPT, MASKED = "clean", "retry", "kept", "masked"


class RetriesExhaustedWarning(RuntimeWarning):
    """A task whose every attempt failed for infrastructure reasons (masked, counted)."""


def failure_class(kind: str, generated_tokens: int) -> str:
    """The class of an invalid rollout's kind; a failure before the policy generated any
    token cannot be the policy's doing, so it is infrastructure whatever its kind."""
    if generated_tokens == 0:
        return INFRASTRUCTURE
    return FAILURE_CLASSES.get(kind, AMBIGUOUS)


class FailureRules:
    """The rule of each class, with the run's settings (``rollout.max_retries``,
    ``ambiguous_failures``, ``failure_rewards``)."""

    def __init__(self, rollout: Any) -> None:
        """``rollout``: the run's ``RolloutConfig``."""
        self.max_retries: int = rollout.max_retries
        self.ambiguous: str = rollout.ambiguous_failures
        self.rewards: dict[str, float] = dict(rollout.failure_rewards)
        self.named: set[tuple[str, int]] = set()
        """(environment, task seed) pairs already named in a RetriesExhaustedWarning."""
        unknown = sorted(set(self.rewards) - set(KEEPABLE))
        if unknown:
            raise ValueError(f"rollout.failure_rewards names {unknown}, which are not "
                             "policy-caused or ambiguous failure kinds; use some of "
                             f"{sorted(KEEPABLE)} (docs/robustness.md)")

    def outcome(self, rollout: Rollout) -> str:
        """What to do with a finished attempt: ``clean`` (nothing failed), ``retry``,
        ``kept`` or ``masked``; a kept rollout is made valid here, with its reward."""
        if rollout.valid:
            reason = rollout.stats.truncation_reason
            if reason in POLICY_TRUNCATIONS:
                self._keep(rollout, reason)
                return KEPT
            return CLEAN
        kind = rollout.stats.error_kind or "unknown"
        rule = failure_class(kind, rollout.num_generated_tokens)
        if rule == AMBIGUOUS:
            rule = {"retry": INFRASTRUCTURE, "keep": POLICY}.get(self.ambiguous, AMBIGUOUS)
        if rule == INFRASTRUCTURE:
            return RETRY
        if rule == POLICY and kind not in NEVER_KEPT:
            rollout.valid = True
            self._keep(rollout, kind)
            return KEPT
        return MASKED

    def _keep(self, rollout: Rollout, kind: str) -> None:
        if kind in self.rewards:
            rollout.reward = float(self.rewards[kind])

    def exhausted(self, rollout: Rollout, task_seed: int, first_kind: str) -> None:
        """Say by name that a task failed on every attempt (it is masked, not learned
        from); once per environment and task seed, later rollouts are only counted."""
        if (rollout.env, task_seed) not in self.named:
            self.named.add((rollout.env, task_seed))
            warn_exhausted(rollout, task_seed, self.max_retries + 1, first_kind)


def retry_id(first_id: str, attempt: int) -> str:
    """The rollout id of retry number ``attempt`` (1, 2, ...) of rollout ``first_id``."""
    return f"{first_id}-retry{attempt}"


def warn_exhausted(rollout: Rollout, task_seed: int, attempts: int, first_kind: str) -> None:
    """Say by name that a task failed on every attempt (it is masked, not learned from)."""
    warnings.warn(RetriesExhaustedWarning(
        f"env {rollout.env!r}, task seed {task_seed}: all {attempts} attempts of rollout "
        f"{rollout.retry_of or rollout.rollout_id} failed for infrastructure reasons "
        f"({first_kind} first, {rollout.stats.error_kind} last); masked and counted "
        f"(invalid/{rollout.stats.error_kind}). A task that always fails this way breaks "
        "its environment: fix it or leave it out; raise rollout.max_retries if the "
        "failures are only frequent. Other rollouts of this task that fail the same way "
        "are only counted."), stacklevel=4)


T = TypeVar("T")


class PersistentFailure(RuntimeError):
    """Every attempt of a call failed; the message says how often and the last error."""


def with_retries(call: Callable[[], T], attempts: int,
                 retriable: Callable[[BaseException], bool] = lambda exc: True
                 ) -> tuple[T, list[BaseException]]:
    """``call()`` until it returns, at most ``attempts`` times (a plan-time check or
    ``check-env`` treats a reset that fails now and then like the runner does); its
    value and the failures before it. Raises :class:`PersistentFailure` (from the last
    failure) when every attempt failed, or the failure itself when it is not retriable."""
    failures: list[BaseException] = []
    for _ in range(max(1, attempts)):
        try:
            return call(), failures
        except Exception as exc:  # noqa: BLE001 - an environment can raise anything
            if not retriable(exc):
                raise
            failures.append(exc)
    last = failures[-1]
    raise PersistentFailure(f"failed all {len(failures)} of {len(failures)} attempts, the "
                            f"last with {type(last).__name__}: {last}") from last

"""Invalid rollouts: counted per environment and kind, reported once, and a stop rule.

:class:`InvalidLog` (the runner's) counts every rollout a collection played, kept or
dropped by dynamic sampling, by environment and invalid kind, and prints the first
occurrence of each (environment, kind) with its traceback as an
:class:`InvalidRolloutWarning`. :class:`InvalidRateMonitor` (every rank's, fed the
broadcast counts) stops the run with :class:`RunStopped` when an environment is mostly
broken; see :meth:`InvalidRateMonitor.observe` for the rule.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict, deque
from typing import Any

from agentrl.rollout.env_contract import EnvError

MIN_ROLLOUTS = 16
"""Rollouts of one environment the stop rule needs before it judges (see ``observe``)."""
WINDOW_STEPS = 20
"""Steps the stop rule looks back at most."""


class InvalidRolloutWarning(RuntimeWarning):
    """The first invalid rollout of an (environment, kind) pair, with its traceback."""


class RunStopped(RuntimeError):
    """The run stopped on purpose (an environment is mostly broken); the message says why."""


class InvalidLog:
    """Counts of played and invalid rollouts, and the first report of each reason."""

    def __init__(self) -> None:
        """Empty counts; reasons already printed are remembered for the whole run."""
        self._printed: set[tuple[str, str]] = set()
        self.reset()

    def reset(self) -> None:
        """Start the counts of a new collection."""
        self.played: Counter[str] = Counter()
        self.invalid: dict[str, Counter[str]] = defaultdict(Counter)
        self.retried: dict[str, Counter[str]] = defaultdict(Counter)
        self.kept: dict[str, Counter[str]] = defaultdict(Counter)
        self.first: dict[str, str] = {}

    def failure(self, spec: Any, error: EnvError) -> None:
        """A rollout's reason to be invalid, with its traceback (the first one prints)."""
        key = (spec.env, error.kind)
        text = str(error) + (f"\n{error.traceback}" if error.traceback else "")
        self.first.setdefault(f"{spec.env}/{error.kind}", text)
        if key not in self._printed:
            self._printed.add(key)
            warnings.warn(InvalidRolloutWarning(
                f"rollout {spec.rollout_id} failed ({error.kind}); the first of its kind "
                f"for env {spec.env!r}, later ones are only counted (retried/{error.kind}, "
                f"invalid/{error.kind} or kept/{error.kind} by its class, "
                f"docs/robustness.md):\n{text}"), stacklevel=2)

    def count(self, rollout: Any, outcome: str = "") -> None:
        """Count one finished rollout (its kind from ``stats.error_kind``; ``outcome``
        "kept": a policy-caused failure trained, by its kind or truncation reason)."""
        self.played[rollout.env] += 1
        if not rollout.valid:
            self.invalid[rollout.env][rollout.stats.error_kind or "unknown"] += 1
        elif outcome == "kept":
            kind = rollout.stats.error_kind or rollout.stats.truncation_reason or "unknown"
            self.kept[rollout.env][kind] += 1

    def retry(self, rollout: Any) -> None:
        """Count one attempt that failed for infrastructure reasons and is retried."""
        self.retried[rollout.env][rollout.stats.error_kind or "unknown"] += 1

    def invalid_counts(self) -> dict[str, dict[str, int]]:
        """Environment -> kind -> invalid rollouts of this collection."""
        return {env: dict(kinds) for env, kinds in self.invalid.items()}


def invalid_figures(invalid: dict[str, dict[str, int]],
                    family: str = "invalid") -> dict[str, float]:
    """``invalid/<kind>`` over all environments and ``env/<name>/invalid/<kind>`` (or
    another ``family``: ``retried``, ``kept``; docs/robustness.md)."""
    out: dict[str, float] = {}
    for env, kinds in sorted(invalid.items()):
        for kind, count in sorted(kinds.items()):
            out[f"{family}/{kind}"] = out.get(f"{family}/{kind}", 0) + count
            out[f"env/{env}/{family}/{kind}"] = count
    return out


class InvalidRateMonitor:
    """Stops the run when an environment's rollouts are mostly invalid."""

    def __init__(self, max_fraction: float, min_rollouts: int = MIN_ROLLOUTS,
                 window_steps: int = WINDOW_STEPS) -> None:
        """``max_fraction``: ``train.max_invalid_fraction`` (1.0 never stops)."""
        self.max_fraction = max_fraction
        self.min_rollouts = min_rollouts
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=window_steps))
        self.first: dict[str, str] = {}

    def observe(self, step: int, played: dict[str, int], invalid: dict[str, dict[str, int]],
                first: dict[str, str]) -> None:
        """Add one step's counts; raise RunStopped when an environment is mostly broken.

        The rule: for each environment, take its most recent steps (newest first, at most
        ``window_steps``) until they hold at least ``min_rollouts`` of its rollouts; stop
        when more than ``max_fraction`` of those are invalid. A large batch is judged on
        one step; a tiny one on as many steps as it takes to reach ``min_rollouts``, so
        one unlucky step of 4 rollouts (3 timeouts) does not end a run, while an
        environment that fails every rollout stops it within ``min_rollouts`` rollouts.
        """
        for key, text in first.items():
            self.first.setdefault(key, text)
        for env, count in played.items():
            self.history[env].append((step, count, Counter(invalid.get(env, {}))))
        for env, steps in self.history.items():
            num, kinds, since = 0, Counter(), step
            for past_step, count, step_kinds in reversed(steps):
                num, since = num + count, past_step
                kinds.update(step_kinds)
                if num >= self.min_rollouts:
                    break
            bad = sum(kinds.values())
            if num >= self.min_rollouts and bad > self.max_fraction * num:
                raise RunStopped(self._summary(env, bad, num, kinds, since, step))

    def _summary(self, env: str, bad: int, num: int, kinds: Counter, since: int,
                 step: int) -> str:
        reasons = ", ".join(f"{kind} {count}" for kind, count in kinds.most_common())
        first_kind = kinds.most_common(1)[0][0]
        first = self.first.get(f"{env}/{first_kind}", "(no traceback recorded)")
        span = f"step {step}" if since == step else f"steps {since}-{step}"
        return (f"environment {env!r} is mostly broken: {bad} of its {num} rollouts in "
                f"{span} were invalid, more than train.max_invalid_fraction = "
                f"{self.max_fraction:g}. Reasons: {reasons}. The first {first_kind}:\n{first}\n"
                "Fix the environment (`agentrl check-env` reports the same violations), or "
                "raise train.max_invalid_fraction (1.0 never stops).")

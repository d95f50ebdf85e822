"""Compaction efficacy: how often rollouts compact, by whom, and whether it kept what the
task needs.

Logged per step overall and per environment (``env/<name>/compaction/...``):

- ``compaction/by_tool/mean``, ``compaction/by_budget/mean``: compactions per rollout that
  the policy called (``compact`` tool) and that the budget forced;
- ``compaction/by_template/mean``: rows started because the chat template re-rendered
  earlier turns (docs/models.md; only when there are such);
- ``compaction/compacted_share``: share of rollouts that compacted at least once;
- ``compaction/summary_tokens/mean``: generated tokens per summary (compactions with one);
- ``compaction/fact_survival``: of the environment's needed facts revealed before each
  compaction (``AgentEnv.needed_facts``), the share the compacted context still held,
  summed over compactions (only when the environment declares facts);
- ``reward/compacted``, ``reward/not_compacted``: mean reward of the rollouts that did
  and did not compact (each only when there are such rollouts).

Compaction never dies silently: :class:`CompactionWatch` applies the rule of
:func:`compaction_decline` to each environment's compact calls per rollout, step by step;
the trainer warns once per environment, and ``agentrl report`` marks the same declines.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from agentrl.types import Rollout


def compaction_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """The figures above for non-empty ``rollouts``."""
    n = len(rollouts)
    records = [c for r in rollouts for c in r.stats.compactions]
    out = {
        f"{prefix}compaction/by_tool/mean": sum(c.cause == "tool" for c in records) / n,
        f"{prefix}compaction/by_budget/mean": sum(c.cause == "budget" for c in records) / n,
        f"{prefix}compaction/compacted_share": sum(
            r.stats.num_compactions > 0 for r in rollouts) / n,
    }
    by_template = sum(c.cause == "template" for c in records)
    if by_template:
        out[f"{prefix}compaction/by_template/mean"] = by_template / n
    summaries = [c.summary_tokens for c in records if c.summary is not None]
    if summaries:
        out[f"{prefix}compaction/summary_tokens/mean"] = sum(summaries) / len(summaries)
    revealed = sum(len(c.facts_revealed) for c in records)
    if revealed:
        kept = sum(len(c.facts_kept) for c in records)
        out[f"{prefix}compaction/fact_survival"] = kept / revealed
    for name, members in (("compacted", [r for r in rollouts if r.stats.num_compactions]),
                          ("not_compacted",
                           [r for r in rollouts if not r.stats.num_compactions])):
        if members:
            out[f"{prefix}reward/{name}"] = sum(r.reward for r in members) / len(members)
    return out


DECLINE_WINDOW = 3
"""Steps in each window of the decline rule (see :func:`compaction_decline`)."""
DECLINE_MIN_CALLS = 0.1
"""Compact calls per rollout the first window must average for the rule to judge: below
it the environment was never compacting, so there is nothing to lose."""
BY_TOOL = "compaction/by_tool/mean"


class CompactionDeclineWarning(RuntimeWarning):
    """An environment's compact calls per rollout fell by more than half (the run goes on)."""


class Decline(msgspec.Struct, frozen=True):
    """Compact calls per rollout of one environment fell by more than half."""

    env: str
    first_steps: tuple[int, int]
    """First and last step of the first window."""
    first_mean: float
    """Compact calls per rollout averaged over the first window."""
    last_steps: tuple[int, int]
    """First and last step of the latest window (the decline was seen at its end)."""
    last_mean: float

    def message(self) -> str:
        """One line naming the environment and the figures."""
        return (f"compaction is dying in environment {self.env!r}: compact calls per "
                f"rollout fell from {self.first_mean:.2f} (mean of steps "
                f"{self.first_steps[0]}-{self.first_steps[1]}) to {self.last_mean:.2f} "
                f"(steps {self.last_steps[0]}-{self.last_steps[1]}), by more than half; "
                "the policy is unlearning compaction (docs/compaction.md)")


def compaction_decline(env: str, points: Sequence[tuple[int, float]],
                       window: int = DECLINE_WINDOW) -> Decline | None:
    """The rule, on one environment's (step, compact calls per rollout) points in step
    order (the steps it was sampled in): the *first window* is the ``window`` points
    starting at the first with any compact call; the *latest window* the last ``window``
    points, after the first window (no overlap). A decline when the first window averages
    at least ``DECLINE_MIN_CALLS`` and the latest averages less than half of it."""
    start = next((i for i, (_, calls) in enumerate(points) if calls > 0), None)
    if start is None or len(points) - start < 2 * window:
        return None
    first, last = points[start:start + window], points[-window:]
    first_mean = sum(c for _, c in first) / window
    last_mean = sum(c for _, c in last) / window
    if first_mean < DECLINE_MIN_CALLS or last_mean >= first_mean / 2:
        return None
    return Decline(env, (first[0][0], first[-1][0]), first_mean,
                   (last[0][0], last[-1][0]), last_mean)


class CompactionWatch:
    """Feeds each step's metrics to :func:`compaction_decline` per environment and
    reports each environment's decline once (the first step the rule holds)."""

    def __init__(self) -> None:
        """No steps seen."""
        self.points: dict[str, list[tuple[int, float]]] = {}
        self.declines: dict[str, Decline] = {}

    def warn(self, metrics: Mapping[str, Any]) -> None:
        """:meth:`observe`, and a :class:`CompactionDeclineWarning` for each new decline."""
        for decline in self.observe(metrics):
            warnings.warn(CompactionDeclineWarning(decline.message()), stacklevel=2)

    def observe(self, metrics: Mapping[str, Any]) -> list[Decline]:
        """Add one step's ``env/<name>/compaction/by_tool/mean`` figures; the declines
        first seen at this step."""
        new = []
        for key, value in metrics.items():
            env = _env_of(key)
            if env is None or value is None:
                continue
            self.points.setdefault(env, []).append((int(metrics["step"]), float(value)))
            decline = None if env in self.declines else \
                compaction_decline(env, self.points[env])
            if decline is not None:
                self.declines[env] = decline
                new.append(decline)
        return new


def _env_of(key: str) -> str | None:
    """``<name>`` of an ``env/<name>/compaction/by_tool/mean`` key; None for other keys."""
    suffix = "/" + BY_TOOL
    if key.startswith("env/") and key.endswith(suffix):
        return key[len("env/"):-len(suffix)]
    return None


def run_declines(records: Sequence[Mapping[str, Any]],
                 up_to_step: float = math.inf) -> tuple[CompactionWatch, list[Decline]]:
    """The declines a run's metrics records show (steps up to ``up_to_step``), as the run
    warned them, and the watch that saw them (a resumed run goes on from it, so it warns
    no decline twice); ``agentrl report`` marks them."""
    watch = CompactionWatch()
    declines = [d for record in records if record.get("step", math.inf) <= up_to_step
                for d in watch.observe(record)]
    return watch, declines

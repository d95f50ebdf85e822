"""Plot panels over ``metrics.jsonl`` figures, shared by ``agentrl report`` and ``agentrl view``.

A panel is a title and the series (metric keys) it draws: the overall figure (solid) and
one per environment (dashed). Only panels with something logged are built, so a run
without validation, tool errors or truncation shows no empty axes; every axis that has
lines gets a legend.

The agent-side panels read what :func:`agentrl.observe.metrics.rollout_figures` logs
(``num_compactions/mean``, the ``compaction/...`` efficacy figures of
:mod:`agentrl.observe.compaction`, ``rows_per_rollout/mean``, ``num_turns/mean``,
``truncation_rate``, ``tool_errors/<kind>``, ``invalid_rate``) and the reason counts other
modules log under ``truncated/<reason>``, ``invalid/<kind>`` (masked), ``retried/<kind>``
and ``kept/<kind>`` (docs/robustness.md), overall and as
``env/<name>/...``. The cost panels read :mod:`agentrl.observe.costs`'s ``cost/...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

Records = Sequence[Mapping[str, Any]]


class Series(NamedTuple):
    """One line: the metric key, its legend label, dashed for per-environment lines."""

    key: str
    label: str
    dashed: bool = False


class Panel(NamedTuple):
    """A titled set of series drawn on one axis."""

    title: str
    series: list[Series]
    markers: bool = False
    """Mark the points (sparse figures such as validations)."""


METRIC_PANELS = (
    ("compactions per rollout", "num_compactions/mean"),
    ("compactions by the policy's tool per rollout", "compaction/by_tool/mean"),
    ("compactions forced by the budget per rollout", "compaction/by_budget/mean"),
    ("rows started by the chat template per rollout", "compaction/by_template/mean"),
    ("share of rollouts that compacted", "compaction/compacted_share"),
    ("needed facts kept by compaction (share)", "compaction/fact_survival"),
    ("tokens per summary", "compaction/summary_tokens/mean"),
    ("reward of rollouts that compacted", "reward/compacted"),
    ("reward of rollouts that did not compact", "reward/not_compacted"),
    ("rows per rollout", "rows_per_rollout/mean"),
    ("turns per rollout", "num_turns/mean"),
    ("truncated share of rollouts", "truncation_rate"),
    ("invalid share of rollouts", "invalid_rate"),
    ("generated tokens per trained rollout", "length/trained_mean"),
    ("generated tokens per generated rollout", "length/generated_mean"),
    ("harness drift (rows)", "harness_drift"),
)
FAMILY_PANELS = (
    ("truncated rollouts by reason", "truncated/"),
    ("tool errors by kind", "tool_errors/"),
    ("invalid rollouts by reason", "invalid/"),
    ("retried attempts by reason (infrastructure)", "retried/"),
    ("policy-caused failures trained, by reason", "kept/"),
    ("harness compactions by reason", "harness_compactions/"),
)


COST_PANELS = (
    ("engine seconds per step (share of busy time)", "cost/generation_seconds"),
    ("environment seconds per step", "cost/env_seconds"),
    ("sandbox seconds per step", "cost/sandbox_seconds"),
    ("generated tokens per step", "cost/generated_tokens"),
    ("prompt tokens per step (every request's context)", "cost/prompt_tokens"),
    ("cost per step (log.costs)", "cost/step"),
    ("cost per reward point (log.costs)", "cost/per_reward_point"),
)
"""What each step cost (:mod:`agentrl.observe.costs`), overall and per environment; the
last two only with a price table."""

SHOWN_WHEN_NONZERO = ("compaction/by_tool/", "compaction/by_budget/",
                      "compaction/compacted_share", "cost/sandbox_seconds")
"""Figures logged at 0 by every run that never compacts (or never by tool): drawn only
once they moved."""


def all_keys(runs: Iterable[Records]) -> set[str]:
    """Every key with a logged (non-null) value in any record of any run; a reason or kind
    count (``truncated/``, ``tool_errors/``, ``invalid/`` families) and the compaction
    counts only when they were ever non-zero, so what never happened draws no flat line."""
    families = tuple(family for _, family in FAMILY_PANELS) + SHOWN_WHEN_NONZERO
    keys = set()
    for records in runs:
        for r in records:
            for k, v in r.items():
                counted = k.startswith(families) or k.split("/", 2)[-1].startswith(families)
                if v is not None and (v != 0 or not counted):
                    keys.add(k)
    return keys


def env_names(keys: Iterable[str]) -> list[str]:
    """Environments named by ``env/<name>/...`` or ``eval/<name>/accuracy`` keys."""
    names = set()
    for key in keys:
        parts = key.split("/")
        if parts[0] == "env" and len(parts) >= 3:
            names.add(parts[1])
        elif parts[0] == "eval" and len(parts) == 3 and parts[2] == "accuracy":
            names.add(parts[1])
    return sorted(names)


def metric_panel(keys: set[str], title: str, key: str, env_key: str | None = None,
                 overall: str = "all", markers: bool = False) -> Panel | None:
    """``key`` overall and ``env/<name>/key`` (or ``env_key`` with ``{env}``) per env."""
    env_key = env_key or "env/{env}/" + key
    series = [Series(key, overall)] if key in keys else []
    series += [Series(env_key.format(env=env), env, dashed=True) for env in env_names(keys)
               if env_key.format(env=env) in keys]
    return Panel(title, series, markers) if series else None


def family_panel(keys: set[str], title: str, family: str) -> Panel | None:
    """Every ``<family><kind>`` key overall, and ``env/<name>/<family><kind>`` per env."""
    series = [Series(k, k[len(family):]) for k in sorted(keys) if k.startswith(family)]
    for env in env_names(keys):
        prefix = f"env/{env}/{family}"
        series += [Series(k, f"{env} · {k[len(prefix):]}", dashed=True)
                   for k in sorted(keys) if k.startswith(prefix)]
    return Panel(title, series) if series else None


def agent_panels(keys: set[str]) -> list[Panel]:
    """Compaction, rows, turns, truncation, tool errors and invalid rollouts: those logged."""
    panels = [metric_panel(keys, title, key) for title, key in METRIC_PANELS]
    panels += [family_panel(keys, title, family) for title, family in FAMILY_PANELS]
    return [p for p in panels if p is not None]


def cost_panels(keys: set[str]) -> list[Panel]:
    """Engine, environment and sandbox seconds and generated and prompt tokens per step,
    and with a price table the cost per step and per reward point: those logged."""
    panels = [metric_panel(keys, title, key) for title, key in COST_PANELS]
    return [p for p in panels if p is not None]


def reward_panel(keys: set[str]) -> Panel | None:
    """Training reward overall and per environment."""
    return metric_panel(keys, "training reward", "reward/mean")


def validation_panel(keys: set[str], metric: str = "eval/accuracy") -> Panel | None:
    """Validation accuracy (mean over environments, and per environment) when logged."""
    return metric_panel(keys, "validation accuracy", metric, env_key="eval/{env}/accuracy",
                        overall="mean", markers=True)


def draw(ax: Any, panel: Panel, runs: Mapping[str, Records], x_key: str = "step",
         x_label: str = "step") -> int:
    """Draw a panel's series for each run (labels "run · series" when several runs);
    adds a legend when anything was drawn; returns the number of lines."""
    drawn = 0
    for run_name, records in runs.items():
        for series in panel.series:
            points = [r for r in records
                      if r.get(series.key) is not None and r.get(x_key) is not None]
            if not points:
                continue
            label = series.label if len(runs) == 1 else f"{run_name} · {series.label}"
            ax.plot([r[x_key] for r in points], [r[series.key] for r in points],
                    label=label, linestyle="--" if series.dashed else "-",
                    linewidth=1.0 if series.dashed else 1.6,
                    marker="o" if panel.markers else None, markersize=3)
            drawn += 1
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(x_label, fontsize=8)
    if x_key == "step":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:
        ax.legend(fontsize=7)
    return drawn

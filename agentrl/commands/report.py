"""``agentrl report RUN_DIR [RUN_DIR ...]``: learning curves of runs side by side, as a PNG.

Validation accuracy (when logged) and training reward against four budgets — cumulative
rollouts, sampled tokens, optimizer updates, active phase time — so runs with different
batch shapes compare on what they spent. With ``--target X`` each run's time-to-target bracket
is printed and drawn: the first validation at or above X and the one before it. Below
them, the agent side against steps (:mod:`agentrl.observe.panels`): compactions and rows per
rollout, turns, truncation and its reasons, tool errors by kind, invalid rollouts by
reason, then what each step cost (engine, environment and sandbox seconds; with a price
table ``log.costs``, cost per step and per reward point), overall and per environment,
each panel only when it was logged. An environment whose compact calls per rollout fell
by more than half (:func:`agentrl.observe.compaction.compaction_decline`, the rule the
run warned by) is printed with a "!" and shaded red on the compact-calls panel.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agentrl.observe.compaction import BY_TOOL, run_declines

HELP = "Plot validation accuracy and reward of one or more runs against rollouts, tokens, " \
       "updates and time, and the agent side (compaction, rows, turns, truncation, tool " \
       "errors, invalid rollouts) and cost (seconds, price) per environment; report " \
       "time-to-target."

X_AXES = (
    ("cumulative/rollouts", "rollouts"),
    ("cumulative/tokens", "sampled tokens"),
    ("cumulative/updates", "optimizer updates"),
    ("cumulative/active_s", "active phase time (s)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: run folders, target accuracy, output file."""
    parser.add_argument("runs", nargs="+", help="run folders (each with metrics.jsonl)")
    parser.add_argument("--target", type=float, default=None,
                        help="accuracy target for the time-to-target bracket")
    parser.add_argument("--metric", default="eval/accuracy",
                        help="validation figure to plot (default: mean accuracy over envs)")
    parser.add_argument("--out", default="report.png", help="PNG file to write")
    parser.add_argument("--smooth", type=int, default=5,
                        help="moving-average window (steps) for training reward curves")


def run(args: argparse.Namespace) -> int:
    """Read each run's metrics, print the brackets, draw the PNG."""
    from agentrl.observe.writers import read_metrics

    runs = {}
    for folder in args.runs:
        records = read_metrics(folder)
        if not records:
            raise ValueError(f"{folder} has no metrics.jsonl with steps; pass a run folder "
                             "written by `agentrl train --out DIR`")
        runs[_label(folder, runs)] = records
    for name, records in runs.items():
        print(describe_run(name, records, args.metric, args.target))
    plot_runs(runs, args.metric, args.target, args.out, args.smooth)
    print(f"wrote {args.out}")
    return 0


def _label(folder: str, taken: dict[str, Any]) -> str:
    label = Path(folder).resolve().name
    return label if label not in taken else f"{label} ({folder})"


def eval_points(records: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """The steps that carry a validation figure, in step order."""
    return [r for r in records if r.get(metric) is not None]


def target_bracket(
    records: list[dict[str, Any]], metric: str, target: float
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(last validation below target, first validation at or above it); None where absent.

    The target was reached somewhere between the two: a run's time-to-target is known
    only to within that bracket, since validations are spaced out.
    """
    before = None
    for record in eval_points(records, metric):
        if record[metric] >= target:
            return before, record
        before = record
    return before, None


def describe_run(name: str, records: list[dict[str, Any]], metric: str,
                 target: float | None) -> str:
    """A few lines: first/last validation, reward, and the time-to-target bracket."""
    points = eval_points(records, metric)
    lines = [f"{name}: {len(records)} steps"]
    if points:
        lines.append(f"  {metric}: {points[0][metric]:.3f} (step {points[0]['step']}) → "
                     f"{points[-1][metric]:.3f} (step {points[-1]['step']})")
    for env in _envs(records):
        env_points = eval_points(records, f"eval/{env}/accuracy")
        if env_points:
            first, last = env_points[0], env_points[-1]
            lines.append(f"    {env}: {first[f'eval/{env}/accuracy']:.3f} → "
                         f"{last[f'eval/{env}/accuracy']:.3f}")
    rewards = [r["reward/mean"] for r in records if r.get("reward/mean") is not None]
    if rewards:
        lines.append(f"  reward/mean, {reward_trend(rewards)}")
    for decline in run_declines(records)[1]:
        lines.append(f"  ! {decline.message()}")
    if target is not None:
        before, after = target_bracket(records, metric, target)
        if after is None:
            lines.append(f"  target {target}: not reached")
        else:
            lines.append(f"  target {target}: reached between {_where(before)} and "
                         f"{_where(after)}")
    return "\n".join(lines)


def reward_trend(rewards: list[float], window: int = 10) -> str:
    """The mean reward of the first and of the last ``window`` steps, two windows that
    never overlap (each at most half the run): a short run is not compared with itself,
    and a run of one step says it is too short to compare."""
    k = min(window, len(rewards) // 2)
    if k == 0:
        return (f"{rewards[0]:.3f} in the run's only step (too short to compare a first "
                "and a last window)")
    steps = f"{k} steps" if k > 1 else "step"
    return (f"first {steps} {sum(rewards[:k]) / k:.3f} → last {steps} "
            f"{sum(rewards[-k:]) / k:.3f}")


def _where(record: dict[str, Any] | None) -> str:
    if record is None:
        return "the start"
    return (f"step {record['step']} ({record.get('cumulative/rollouts', 0)} rollouts, "
            f"{record.get('cumulative/tokens', 0)} tokens, "
            f"{record.get('cumulative/active_s', 0.0):.0f}s)")


def _envs(records: list[dict[str, Any]]) -> list[str]:
    """Environments that appear anywhere in a run's metrics."""
    from agentrl.observe.panels import all_keys, env_names

    return env_names(all_keys([records]))


def smoothed(records: list[dict[str, Any]], key: str, window: int) -> list[dict[str, Any]]:
    """Records with ``key`` replaced by its trailing moving average over ``window`` steps."""
    points = [r for r in records if r.get(key) is not None]
    out = []
    for i, record in enumerate(points):
        recent = points[max(0, i - window + 1): i + 1]
        out.append({**record, key: sum(r[key] for r in recent) / len(recent)})
    return out


def plot_runs(runs: dict[str, list[dict[str, Any]]], metric: str, target: float | None,
              out: str | Path, smooth: int = 5) -> None:
    """Draw :func:`build_figure` into a PNG file."""
    import matplotlib.pyplot as plt

    fig = build_figure(runs, metric, target, smooth)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def build_figure(runs: dict[str, list[dict[str, Any]]], metric: str, target: float | None,
                 smooth: int = 5) -> Any:
    """Validation (when logged) and training reward × four budgets; per run, the overall
    curve (solid) and one per environment (dashed): mixes learn unevenly. Then the
    agent-side panels against steps (compaction, rows, turns, truncation, tool errors,
    invalid rollouts) and the cost panels (seconds, cost per step and per reward point),
    only those logged. Every axis with lines has a legend; none is left empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.observe.panels import agent_panels, all_keys, cost_panels, draw

    keys = all_keys(runs.values())
    has_eval = any(k == metric or (k.startswith("eval/") and k.endswith("/accuracy"))
                   for k in keys)
    budget_rows = (["eval"] if has_eval else []) + ["reward"]
    panels = agent_panels(keys) + cost_panels(keys)
    ncols = len(X_AXES)
    nrows = len(budget_rows) + -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.5 * nrows), squeeze=False)
    for row, kind in enumerate(budget_rows):
        for col, (x_key, x_label) in enumerate(X_AXES):
            ax = axes[row][col]
            if kind == "eval":
                _plot_validation(ax, runs, x_key, metric, target)
                ax.set_title(f"{metric} vs {x_label}", fontsize=9)
            else:
                _plot_reward(ax, runs, x_key, smooth)
                ax.set_title(f"training reward ({smooth}-step mean) vs {x_label}", fontsize=9)
            ax.set_xlabel(x_label)
            if ax.lines:
                ax.legend(fontsize=7)
    cells = [axes[r][c] for r in range(len(budget_rows), nrows) for c in range(ncols)]
    for ax, panel in zip(cells, panels, strict=False):
        draw(ax, panel, runs)
        if any(series.key.endswith(BY_TOOL) for series in panel.series):
            mark_declines(ax, runs)
    for ax in axes.flat:
        if not ax.lines:  # nothing logged for this cell: no empty axis in the figure
            fig.delaxes(ax)
    fig.tight_layout()
    return fig


def mark_declines(ax: Any, runs: dict[str, list[dict[str, Any]]]) -> None:
    """A red span over each decline's latest window, on the compact-calls panel."""
    marked = [(name, d) for name, records in runs.items() for d in run_declines(records)[1]]
    for name, decline in marked:
        ax.axvspan(decline.last_steps[0], decline.last_steps[1], color="red", alpha=0.15,
                   label=f"compaction dying: {decline.env}"
                   + (f" ({name})" if len(runs) > 1 else ""))
    if marked:
        ax.legend(fontsize=7)


def _plot_validation(ax: Any, runs: dict[str, list[dict[str, Any]]], x_key: str, metric: str,
                     target: float | None) -> None:
    for name, records in runs.items():
        _plot_metric(ax, records, x_key, metric, name, target)
        for env in _envs(records):
            _plot_metric(ax, records, x_key, f"eval/{env}/accuracy", f"{name} · {env}", None,
                         dashed=True)
    if target is not None and ax.lines:
        ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target}")


def _plot_reward(ax: Any, runs: dict[str, list[dict[str, Any]]], x_key: str,
                 smooth: int) -> None:
    for name, records in runs.items():
        _plot_metric(ax, smoothed(records, "reward/mean", smooth), x_key, "reward/mean", name,
                     None)
        for env in _envs(records):
            key = f"env/{env}/reward/mean"
            _plot_metric(ax, smoothed(records, key, smooth), x_key, key, f"{name} · {env}",
                         None, dashed=True)


def _plot_metric(ax: Any, records: list[dict[str, Any]], x_key: str, y_key: str, name: str,
                 target: float | None, dashed: bool = False) -> None:
    points = [r for r in records if r.get(y_key) is not None and r.get(x_key) is not None]
    if not points:
        return
    (line,) = ax.plot([r[x_key] for r in points], [r[y_key] for r in points],
                      marker="o" if y_key.startswith("eval/") else None, markersize=3,
                      label=name, linestyle="--" if dashed else "-",
                      linewidth=1.0 if dashed else 1.6)
    if target is None:
        return
    before, after = target_bracket(records, y_key, target)
    if after is not None:
        left = before.get(x_key, 0) if before is not None else 0
        ax.axvspan(left, after.get(x_key, 0), color=line.get_color(), alpha=0.15)

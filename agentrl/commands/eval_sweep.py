"""``agentrl eval ... --sweep KEY=V1,V2,...``: the table and the train-length -> test-length
curve of :mod:`agentrl.rollout.sweep`."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.rollout.sweep import (
    BASELINES,
    CellResult,
    Setting,
    SweepAxis,
    evaluate_setting,
    parse_sweep,
    plan_sweep,
    trained_value,
)


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """``--sweep`` (repeatable: a grid), ``--baselines``, ``--plot``, ``--json``."""
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="evaluate at each value of KEY: an environment keyword (e.g. "
                             "num_pages=6,12,24) or compaction.max_context_tokens, "
                             "compaction.max_compactions, compaction.strategy; several "
                             "--sweep flags make a grid")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help="with --sweep: baselines played beside the policy at every "
                             f"cell, comma-separated from {', '.join(BASELINES)} (full: no "
                             "context budget), or none (default: both)")
    parser.add_argument("--plot", default="eval_sweep.png",
                        help="with --sweep: the PNG of accuracy against the first numeric "
                             "swept key, with 95%% intervals (default eval_sweep.png)")
    parser.add_argument("--json", default=None,
                        help="with --sweep: also write every row as JSON to this file")


def plan(config: Any, args: argparse.Namespace) -> tuple[list[Setting], list[SweepAxis]]:
    """Parse and check the sweep before any model is loaded (errors cost nothing)."""
    axes = [parse_sweep(text) for text in args.sweep]
    names = [b.strip() for b in args.baselines.split(",") if b.strip()]
    baselines = [] if names == ["none"] else names
    settings, left_out = plan_sweep(config, axes, baselines)
    if left_out:
        print(f"left out (they take no {', '.join(a.key for a in axes)}): "
              f"{', '.join(left_out)}")
    return settings, axes


def widest(config: Any, settings: Sequence[Setting]) -> Any:
    """``config`` with the compaction of the setting whose engine requests are longest:
    one engine, built for it, serves every setting."""
    import msgspec

    from agentrl.engines.build import engine_max_len

    longest = max(settings, key=lambda s: engine_max_len(s.config, 1 << 30))
    return msgspec.structs.replace(config, compaction=longest.config.compaction)


def run_sweep(engine: Any, tokenizer: Any, config: Any, settings: list[Setting],
              axes: list[SweepAxis], args: argparse.Namespace) -> int:
    """Evaluate every setting, print the table, draw the curve."""
    num_tasks = args.tasks or config.train.eval_tasks_per_env
    results: list[CellResult] = []
    for index, setting in enumerate(settings, start=1):
        start = time.perf_counter()
        results += asyncio.run(evaluate_setting(engine, tokenizer, setting, num_tasks,
                                                args.temperature))
        cell = " ".join(f"{k}={v}" for k, v in setting.cell.items())
        print(f"[{index}/{len(settings)}] {cell} {setting.method}: "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print(format_table(results, [a.key for a in axes]))
    x_key = plot_axis(axes)
    trained = {a.key: trained_value(config, a.key) for a in axes}
    plot_sweep(results, x_key, trained.get(x_key), args.plot)
    print(f"wrote {args.plot}")
    if args.json:
        import msgspec

        Path(args.json).write_bytes(msgspec.json.encode(
            {"trained": trained, "rows": results}))
        print(f"wrote {args.json}")
    return 0


def format_table(results: Sequence[CellResult], keys: list[str]) -> str:
    """One row per (cell, method, environment): accuracy, its 95% interval, the
    compaction figures and truncation."""
    header = [*keys, "method", "env", "accuracy", "95% interval", "n", "compact/rollout",
              "forced/rollout", "fact survival", "truncated", "invalid"]
    lines = [header]
    for r in results:
        lines.append([*(str(r.cell[k]) for k in keys), r.method, r.env, f"{r.accuracy:.3f}",
                      f"[{r.low:.3f}, {r.high:.3f}]", str(r.num_tasks),
                      f"{r.compact_calls:.2f}", f"{r.forced_compactions:.2f}",
                      "-" if r.fact_survival is None else f"{r.fact_survival:.2f}",
                      _share(r.truncated, r.truncation_reason),
                      _share(r.invalid, r.invalid_reason)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)


def _share(share: float, reason: str | None) -> str:
    return f"{share:.2f}" + (f" ({reason})" if reason else "")


def plot_axis(axes: Sequence[SweepAxis]) -> str:
    """The x axis: the first key whose values are all numbers (environment keywords
    first: the task's length), else the first key."""
    numeric = [a for a in axes if all(isinstance(v, int | float) and not isinstance(v, bool)
                                      for v in a.values)]
    for axis in numeric:
        if not axis.key.startswith("compaction."):
            return axis.key
    return (numeric or list(axes))[0].key


def x_positions(values: list[Any]) -> dict[Any, float]:
    """Where each swept value sits on the x axis: numbers spanning 4x or more (6, 12, 24,
    48 pages) on a log2 scale, other numbers as they are, anything else in order."""
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numeric:
        return {v: float(i) for i, v in enumerate(values)}
    if min(values) > 0 and max(values) >= 4 * min(values):
        return {v: math.log2(v) for v in values}
    return {v: float(v) for v in values}


def plot_sweep(results: Sequence[CellResult], x_key: str, trained: Any,
               out: str | Path) -> None:
    """Accuracy against ``x_key``, one line per (other keys, method, environment), each
    point with its 95% interval (lines nudged apart a little so equal points stay
    visible); a dotted line where the config trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = list(dict.fromkeys(r.cell[x_key] for r in results))
    position = x_positions(values)
    lines: dict[str, list[CellResult]] = {}
    for r in results:
        rest = ", ".join(f"{k}={v}" for k, v in r.cell.items() if k != x_key)
        label = " · ".join(part for part in (r.method, rest, r.env) if part)
        lines.setdefault(label, []).append(r)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    span = (max(position.values()) - min(position.values())) or 1
    for index, (label, points) in enumerate(lines.items()):
        nudge = (index - (len(lines) - 1) / 2) * 0.012 * span  # overlapping bars apart
        xs = [position[p.cell[x_key]] + nudge for p in points]
        ys = [p.accuracy for p in points]
        errors = [[p.accuracy - p.low for p in points], [p.high - p.accuracy for p in points]]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label,
                    linestyle="--" if points[0].method in BASELINES else "-")
    if trained in position:
        ax.axvline(position[trained], color="grey", linestyle=":", label=f"trained at {trained}")
    ax.set_xticks(list(position.values()), [str(v) for v in values])
    ax.set_xlabel(x_key)
    ax.set_ylabel("held-out accuracy (95% interval)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"accuracy beyond the training length ({x_key})", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)

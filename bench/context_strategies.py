"""Context strategies side by side on the long-horizon Ledger: which compaction keeps what
the task needs, at equal rollouts.

    python -m bench.context_strategies [--quick] [--seeds 3] [--out runs/context_strategies]

One warm start (``assets/ledger-sft``, or ``--warm-start DIR``), then ``agentrl train
configs/ledger.toml`` once per strategy and seed, sequentially (each run uses the whole
machine), with the same rollouts per step and steps per run:

- ``truncate``: no compaction; the rollout ends at the budget (plain truncation);
- ``drop_oldest``: old turns dropped, a marker left;
- ``summarize``: the policy writes a summary when the budget is reached;
- ``tool``: the policy calls its ``compact`` tool when it decides to (summarize when the
  budget forces it).

It prints held-out accuracy (greedy, ``eval_tasks_per_env`` tasks) against cumulative
rollouts per strategy (mean over seeds), the last validation per strategy, and the
difference between every two strategies with a paired bootstrap interval: task ids are
resampled jointly across seeds (the same held-out tasks are played by every run, so a
resample keeps each task's outcomes under both strategies and every seed together), and
writes ``OUT/strategies.png`` (the overlay) and ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "ledger.toml"
STRATEGIES = ("truncate", "drop_oldest", "summarize", "tool")
QUICK = ["train.num_steps=2", "train.eval_every=2", "train.eval_tasks_per_env=4",
         "batch.rollout_batch_size=2", "batch.n_samples_per_prompt=2",
         "batch.global_batch_size=4"]
"""A smoke run's settings: two steps of four rollouts, four held-out tasks."""


def train(strategy: str, seed: int, out: Path, warm_start: Path, extra: list[str]) -> Path:
    """One ``agentrl train`` run; returns its folder (reused when it already finished)."""
    run_dir = out / f"{strategy}-seed{seed}"
    if (run_dir / "done").exists():
        return run_dir
    sets = [f'compaction.strategy="{strategy}"', f"train.seed={seed}",
            f'model.path="{warm_start}"', "log.live=false", *extra]
    command = [sys.executable, "-m", "agentrl", "train", str(CONFIG), "--out", str(run_dir)]
    for setting in sets:
        command += ["--set", setting]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    (run_dir / "done").write_text(f"{time.perf_counter() - start:.1f}\n")
    return run_dir


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSONL file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """(cumulative rollouts, held-out accuracy) at every validation of a run."""
    rollouts, points = 0, []
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        rollouts += int(record.get("num_rollouts", 0) or 0)
        if record.get("eval/accuracy") is not None:
            points.append((rollouts, float(record["eval/accuracy"])))
    return points


def last_outcomes(run_dir: Path) -> np.ndarray:
    """Per held-out task, correct (1) or not (0) at the run's last validation."""
    last = read_jsonl(run_dir / "eval_tasks.jsonl")[-1]["tasks"]
    return np.array([v for env in sorted(last) for v in last[env]], dtype=float)


def paired_interval(a: np.ndarray, b: np.ndarray, num_resamples: int = 4000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Mean of a − b and its 95% bootstrap interval; ``a``, ``b`` are [seeds, tasks]
    outcomes of two strategies on the same tasks; task ids are resampled jointly across
    seeds (each resample keeps a task's outcomes under both strategies and all seeds)."""
    rng = np.random.default_rng(seed)
    diff = (a - b).mean(axis=0)  # per task, over seeds
    picks = rng.integers(0, len(diff), size=(num_resamples, len(diff)))
    means = diff[picks].mean(axis=1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(
        np.percentile(means, 97.5))


def summarize(runs: dict[str, list[Path]]) -> dict[str, Any]:
    """Curves, last accuracies and paired differences of every strategy's runs."""
    outcomes = {s: np.stack([last_outcomes(d) for d in dirs]) for s, dirs in runs.items()}
    summary: dict[str, Any] = {"strategies": {}, "differences": []}
    for strategy, dirs in runs.items():
        curves = [curve(d) for d in dirs]
        points = sorted({x for c in curves for x, _ in c})
        mean = [float(np.mean([dict(c).get(x, np.nan) for c in curves])) for x in points]
        acc = outcomes[strategy].mean(axis=1)
        summary["strategies"][strategy] = {
            "rollouts": points, "accuracy": mean, "last_per_seed": acc.tolist(),
            "last_mean": float(acc.mean()),
            "minutes_per_run": [float((d / "done").read_text()) / 60 for d in dirs]}
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff, low, high = paired_interval(outcomes[a], outcomes[b])
            summary["differences"].append({"a": a, "b": b, "diff": diff, "low": low,
                                           "high": high})
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """The accuracy-against-rollouts table, the last validations and the differences."""
    print("\nheld-out accuracy (greedy) against cumulative rollouts, mean over seeds:")
    for strategy, s in summary["strategies"].items():
        points = ", ".join(f"{x}: {y:.3f}" for x, y in zip(s["rollouts"], s["accuracy"],
                                                            strict=True))
        print(f"  {strategy:<12} {points}")
    print("\nlast validation per strategy (per seed) and minutes per run:")
    for strategy, s in summary["strategies"].items():
        seeds = " ".join(f"{v:.3f}" for v in s["last_per_seed"])
        minutes = " ".join(f"{m:.1f}" for m in s["minutes_per_run"])
        print(f"  {strategy:<12} {s['last_mean']:.3f}  ({seeds})  [{minutes} min]")
    print("\npaired differences (a − b) with 95% bootstrap intervals over task ids:")
    for d in summary["differences"]:
        excludes = "excludes 0" if d["low"] > 0 or d["high"] < 0 else "includes 0"
        print(f"  {d['a']:<12} − {d['b']:<12} {d['diff']:+.3f}  "
              f"[{d['low']:+.3f}, {d['high']:+.3f}]  {excludes}")


def plot(summary: dict[str, Any], path: Path) -> None:
    """Held-out accuracy against cumulative rollouts, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for strategy, s in summary["strategies"].items():
        ax.plot(s["rollouts"], s["accuracy"], marker="o", label=strategy)
    ax.set_xlabel("cumulative rollouts")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Ledger: context strategies at equal rollouts (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the grid (or reuse finished runs), print and plot the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a two-step smoke run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--warm-start", type=Path, default=ROOT / "assets" / "ledger-sft")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "context_strategies")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="extra config overrides for every run")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    extra = (QUICK if args.quick else []) + args.overrides
    start = time.perf_counter()
    runs: dict[str, list[Path]] = {s: [] for s in strategies}
    for seed in range(args.seeds):
        for strategy in strategies:  # interleaved: a slow spell hits every strategy
            print(f"[{time.perf_counter() - start:6.0f} s] {strategy}, seed {seed}",
                  flush=True)
            runs[strategy].append(train(strategy, seed, args.out, args.warm_start.resolve(),
                                        extra))
    summary = summarize(runs)
    summary["minutes"] = (time.perf_counter() - start) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(summary, args.out / "strategies.png")
    print_summary(summary)
    print(f"\nwhole grid: {summary['minutes']:.1f} min; plot: {args.out / 'strategies.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

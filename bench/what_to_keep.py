"""Does RL discover what a summary must keep? A warm start that compacts at the right
moments but keeps the wrong facts, then RL, with the summary tokens trained or masked.

    python -m bench.what_to_keep [--quick] [--seeds 3] [--out runs/what_to_keep]

The warm start (``agentrl sft configs/drill_keep.toml --copy-rows 8``, from the generic
base unless ``--base`` names another; the copy rows keep the base's copy circuit through
the drills' SFT, ``docs/base-model.md``) imitates a
demonstrator that calls ``compact`` right after the page holding the asked fact but
writes a random fact of that page into the summary (``keeps = "random"``); its answers
are right, so it also teaches answering without the fact. Only reward can teach which
fact to keep. What the warm start learns differs (README, benchmarks): it compacts right
after the read's first page, whichever page holds the asked fact (the first does in half
the tasks); from the base rebuilt on 2026-12-06 its summary then keeps the asked value
(56 of 64 such held-out rollouts: the base's lookup outlives the demonstrator's random
picks), and most of what RL can add is compacting, and keeping the fact, after a later
page that holds it. An answer before the last page is read scores 0
(``read_all``): without that, RL gained as much with the summary's gradient masked, by
answering right after the page that held the fact. Then ``agentrl train
configs/drill_keep.toml`` once per seed and arm:

- ``train``: every generated token is trained, the summary's included (the default,
  ``loss.summary_tokens = "train"``);
- ``mask``: the summary tokens get no gradient (``loss.summary_tokens = "mask"``), as in
  the CompactionRL ablation where summaries then degenerate.

It prints, per arm, held-out accuracy (greedy, the same tasks in every run) before RL (the
step-0 validation) and after, the gain with a paired bootstrap interval over task ids
(resampled jointly across seeds), fact survival (the share of revealed needed facts a
compaction kept) over the first and the last steps, and the difference between the arms'
gains; it writes ``OUT/summary.json``.
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

from bench.context_strategies import QUICK, paired_interval, read_jsonl

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "drill_keep.toml"
ARMS = ("train", "mask")
WARM_START = ["--num-steps", "300", "--num-demonstrations", "600", "--copy-rows", "8"]
QUICK_WARM_START = ["--num-steps", "2", "--num-demonstrations", "8"]


def agentrl(*argv: str) -> None:
    """One ``python -m agentrl`` command in the repository root; raises when it fails."""
    subprocess.run([sys.executable, "-m", "agentrl", *argv], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)


def warm_start(out: Path, quick: bool, sft_args: list[str]) -> Path:
    """The weak demonstrator's warm start (reused when it exists)."""
    folder = out / "warm-start"
    if not (folder / "config.json").exists():
        agentrl("sft", str(CONFIG), "--out", str(folder),
                *(QUICK_WARM_START if quick else WARM_START), *sft_args)
    return folder


def train(arm: str, seed: int, out: Path, model: Path, extra: list[str]) -> Path:
    """One RL run of ``arm``; returns its folder (reused when it already finished)."""
    run_dir = out / f"{arm}-seed{seed}"
    if (run_dir / "done").exists():
        return run_dir
    sets = [f'loss.summary_tokens="{arm}"', f"train.seed={seed}", f'model.path="{model}"',
            "log.live=false", *extra]
    start = time.perf_counter()
    agentrl("train", str(CONFIG), "--out", str(run_dir), *[a for s in sets for a in ("--set", s)])
    (run_dir / "done").write_text(f"{time.perf_counter() - start:.1f}\n")
    return run_dir


def outcomes(run_dir: Path, which: int) -> np.ndarray:
    """Per held-out task, correct (1) or not (0) at validation ``which`` (0: before RL)."""
    record = read_jsonl(run_dir / "eval_tasks.jsonl")[which]["tasks"]
    return np.array([v for env in sorted(record) for v in record[env]], dtype=float)


def survival(run_dir: Path, window: int = 3) -> tuple[float, float]:
    """Fact survival over the first and the last ``window`` training steps."""
    values = [float(r["compaction/fact_survival"]) for r in read_jsonl(run_dir / "metrics.jsonl")
              if r.get("compaction/fact_survival") is not None]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values[:window])), float(np.mean(values[-window:]))


def summarize(runs: dict[str, list[Path]]) -> dict[str, Any]:
    """Before/after accuracy, RL's gain with its interval, survival, and the arms' gap."""
    summary: dict[str, Any] = {"arms": {}}
    gains = {}
    for arm, dirs in runs.items():
        before = np.stack([outcomes(d, 0) for d in dirs])
        after = np.stack([outcomes(d, -1) for d in dirs])
        gain, low, high = paired_interval(after, before)
        gains[arm] = after - before
        first, last = zip(*(survival(d) for d in dirs), strict=True)
        summary["arms"][arm] = {
            "before": float(before.mean()), "after": float(after.mean()),
            "after_per_seed": after.mean(axis=1).tolist(), "gain": gain, "low": low,
            "high": high, "survival_first": float(np.nanmean(first)),
            "survival_last": float(np.nanmean(last)),
            "minutes_per_run": [float((d / "done").read_text()) / 60 for d in dirs]}
    if len(gains) == 2:
        (a, ga), (b, gb) = gains.items()
        diff, low, high = paired_interval(ga, gb)
        summary["difference"] = {"a": a, "b": b, "diff": diff, "low": low, "high": high}
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """One line per arm, then the gap between the arms' gains."""
    print("\narm    before  after (per seed)          RL gain [95% interval]    "
          "fact survival first -> last steps")
    for arm, s in summary["arms"].items():
        seeds = " ".join(f"{v:.3f}" for v in s["after_per_seed"])
        print(f"{arm:<6} {s['before']:.3f}   {s['after']:.3f} ({seeds})  {s['gain']:+.3f} "
              f"[{s['low']:+.3f}, {s['high']:+.3f}]   {s['survival_first']:.2f} -> "
              f"{s['survival_last']:.2f}")
    if "difference" in summary:
        d = summary["difference"]
        print(f"\ngain({d['a']}) - gain({d['b']}): {d['diff']:+.3f} "
              f"[{d['low']:+.3f}, {d['high']:+.3f}]")


def main(argv: list[str] | None = None) -> int:
    """Warm start once, train every arm and seed (interleaved), print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a two-step smoke run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "what_to_keep")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="extra config overrides for every RL run")
    parser.add_argument("--base", type=Path, help="warm-start from this base model "
                        "(agentrl sft --base; default: the generic base, assets/base)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    sft_args = ["--base", str(args.base)] if args.base else []
    model = warm_start(args.out, args.quick, sft_args).resolve()
    extra = (QUICK if args.quick else []) + args.overrides
    runs: dict[str, list[Path]] = {a: [] for a in args.arms.split(",") if a}
    for seed in range(args.seeds):
        for arm in runs:  # interleaved: a slow spell hits every arm
            print(f"[{time.perf_counter() - start:6.0f} s] {arm}, seed {seed}", flush=True)
            runs[arm].append(train(arm, seed, args.out, model, extra))
    summary = summarize(runs)
    summary["minutes"] = (time.perf_counter() - start) / 60
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The unmodified example agent learning through the endpoint: reward by step.

    python -m bench.harness_learning [--steps N] [--seed S] [--out DIR]

Trains examples/harness/calc_agent.py (a plain tool-calling loop on the official
``openai`` client, its ``calculate`` tool its own) on agentrl/Calculator-v0's tasks from
its config's warm start (assets/calc-agent-sft: demonstrations of a weak demonstrator,
who calls the tool in 40% of its episodes, played through the program itself; recipe in
the config's header), deterministically (``train.deterministic``), at the config's lr,
4 groups x 8 rollouts per step in 2 updates of 16, and prints
the training reward of every step, the mean of the first and last quarter of the steps,
the wall time and the machine's load (``os.getloadavg``) before and after.
``tests/harness/test_train_harness.py`` checks two smaller steps of this config (rows,
rewards, advantages, weights, versions), and that the reward rises over the first steps
of this run (``train``).

Every torch op runs single-threaded (on a small shared machine threads only fight).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.cli import main
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "harness" / "calc_agent.toml"
SETTINGS = ["batch.rollout_batch_size=4", "batch.global_batch_size=16", "optim.warmup_steps=0",
            "train.deterministic=true", "log.rollouts_every=0", "rollout.max_new_tokens=32",
            "rollout.max_rollout_tokens=96"]
"""The run's overrides of examples/harness/calc_agent.toml."""
REWARD = "env/calc_agent/reward/mean"
"""The metric of a step's training reward."""


def train(out: Path, num_steps: int, seed: int) -> list[dict[str, Any]]:
    """Train the example agent ``num_steps`` steps at ``train.seed`` = ``seed`` into the
    run folder ``out``; the metrics of every step. Run from the repository root: the
    config names its warm start by its repository path."""
    settings = [f"train.num_steps={num_steps}", f"train.seed={seed}", *SETTINGS]
    overrides = [arg for s in settings for arg in ("--set", s)]
    if main(["train", str(CONFIG), "--out", str(out), *overrides]) != 0:
        raise RuntimeError(f"agentrl train {CONFIG} failed")
    return read_metrics(out)


def load() -> str:
    """The 1, 5 and 15 minute load averages, as text."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def main_bench() -> None:
    """Train, then print the reward curve."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="train.seed")
    parser.add_argument("--out", type=Path, default=None,
                        help="run folder (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="agentrl-harness-bench-")) / "run"
    os.chdir(ROOT)  # the config names the warm start by its repository path
    print(f"load before: {load()}", flush=True)
    start = time.perf_counter()
    steps = train(out, args.steps, args.seed)
    seconds = time.perf_counter() - start
    rewards = [s[REWARD] for s in steps]
    invalid = sum(s["invalid_rate"] for s in steps) / len(steps)
    print("step  reward/mean  rows/rollout")
    for s, reward in zip(steps, rewards, strict=True):
        print(f"{s['step']:>4}  {reward:>11.3f}  {s['rows_per_rollout/mean']:>12.2f}")
    quarter = max(1, len(rewards) // 4)
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    print(f"first {quarter} steps {first:.3f}, last {quarter} steps {last:.3f} "
          f"({last - first:+.3f}); invalid rate {invalid:.3f}; {seconds:.0f} s; "
          f"load after: {load()}; run folder {out}")


if __name__ == "__main__":
    main_bench()

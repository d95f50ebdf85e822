"""Does LoRA learn like full fine-tuning? The CPU quickstart at equal rollouts, side by side.

    python -m bench.lora_learning [--steps 80] [--rank 16] [--lrs 3e-3] [--out /tmp/lora-bench]

Runs `agentrl train configs/calc_countdown.toml` (the earlier quickstart) once with every
weight trained (its own lr, 3e-4) and once per LoRA lr (rank ``--rank``, alpha 2·rank,
every projection), each for ``--steps`` steps (16 groups × 8 rollouts each: equal
rollouts), and prints the greedy held-out accuracy (256 tasks per environment) of every
validation, the final figure of each arm and its shortfall against full fine-tuning (the
target: within 0.05).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

QUICKSTART = "configs/calc_countdown.toml"


def train(out: Path, steps: int, overrides: list[str]) -> tuple[list[dict], float]:
    """One quickstart run; (its validation records, wall seconds)."""
    argv = [sys.executable, "-m", "agentrl", "train", QUICKSTART, "--out", str(out),
            "--set", f"train.num_steps={steps}", "--set", "log.live=false",
            "--set", f"train.checkpoint_every={steps}"]
    argv += [arg for o in overrides for arg in ("--set", o)]
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "eval/accuracy" in r], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lrs", default="3e-3", help="LoRA learning rates, comma-separated")
    parser.add_argument("--out", default="/tmp/lora-bench")
    options = parser.parse_args()
    root = Path(options.out)
    arms = {"full (lr 3e-4)": []}
    for lr in options.lrs.split(","):
        arms[f"LoRA r{options.rank} lr {lr}"] = [
            f"model.lora.rank={options.rank}", f"model.lora.alpha={2 * options.rank}",
            f"optim.lr={lr}"]
    results = {}
    for index, (name, overrides) in enumerate(arms.items()):
        results[name] = train(root / f"arm{index}", options.steps, overrides)
        evals, seconds = results[name]
        curve = "  ".join(f"{r['step']}:{r['eval/accuracy']:.3f}" for r in evals)
        print(f"{name:<22} {seconds / 60:5.1f} min  eval/accuracy by step: {curve}", flush=True)
    full = results["full (lr 3e-4)"][0][-1]["eval/accuracy"]
    print(f"final held-out accuracy after {options.steps} steps (equal rollouts):")
    for name, (evals, _) in results.items():
        last = evals[-1]
        per_env = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in sorted(last.items())
                            if k.startswith("eval/") and k.count("/") == 2)
        print(f"  {name:<22} {last['eval/accuracy']:.3f} ({per_env}); "
              f"vs full {last['eval/accuracy'] - full:+.3f}")


if __name__ == "__main__":
    main()

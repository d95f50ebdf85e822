"""Rollouts per second of the runner: tiny model, TorchEngine, a cheap scripted environment.

    python bench/runner_throughput.py [--groups 4] [--group-size 4]

Prints rollouts/s and generated tokens/s for one collection, and the same collection with
compaction on (drop_oldest, small budget) side by side, with their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch

from agentrl.config import config_from_dict
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.rollout.demo import ScriptedLongEnv
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler


def collect(model, tokenizer, groups: int, size: int, strategy: str) -> tuple[float, int, int]:
    """Seconds, rollouts and generated tokens of one collection."""
    config = config_from_dict({
        "environments": [{"id": "bench:ScriptedLongEnv", "name": "scripted"}],
        "batch": {"rollout_batch_size": groups, "n_samples_per_prompt": size,
                  "global_batch_size": groups * size},
        "rollout": {"max_new_tokens": 16, "max_turns": 6},
        "compaction": {"strategy": strategy, "max_context_tokens": 200, "keep_last_turns": 1,
                       "max_compactions": 8},
    })
    engine = TorchEngine(model, tokenizer, max_batch_size=groups * size, max_len=1024)
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler({"scripted": 1}, 0),
                           make_env=lambda _: ScriptedLongEnv(horizon=6))
    start = time.perf_counter()
    result = asyncio.run(runner.collect(0, groups * size))
    seconds = time.perf_counter() - start
    return seconds, len(result.rollouts), sum(r.num_generated_tokens for r in result.rollouts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_checkpoint(Path(tmp) / "m", hidden_size=64, vocab_size=400)
        model = load_pretrained(path, attention="torch").eval()
        tokenizer = load_tokenizer(path)
    rows = {}
    for strategy in ("none", "drop_oldest"):
        rows[strategy] = collect(model, tokenizer, args.groups, args.group_size, strategy)
        seconds, rollouts, tokens = rows[strategy]
        print(f"compaction {strategy:<12}: {rollouts / seconds:7.2f} rollouts/s  "
              f"{tokens / seconds:8.1f} generated tokens/s  ({rollouts} rollouts, {seconds:.2f} s)")
    ratio = rows["drop_oldest"][0] / rows["none"][0]
    print(f"time with compaction / without: {ratio:.2f}")


if __name__ == "__main__":
    main()

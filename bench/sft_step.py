"""``agentrl sft``'s step as it is (:func:`agentrl.train.sft.sft_step`: the RL update's
forward, the LM head only at the generated tokens, the RL update's micro-batch budget)
against the plain step it replaced (log-probs and entropy at every position, packs of
4 × the longest row), on the docs' LogSearch mix (docs/writing-environments.md) at
hidden 128, 2 layers: demonstration rows played through the runner, the same sampled
rows for both ways, alternating in one process.

    python -m bench.sft_step [--steps 8] [--threads 1] [--demonstrations 300]

Prints each way's median seconds per step, of CPU (this process's, which a machine
shared with other work does not inflate) and of wall clock, their ratio, and the first
losses of each (they agree: the same cross-entropy).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.envs.demonstrations import demonstration_policies
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.packing import collate, pack
from agentrl.reassembler import to_rows
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.train.sft import sft_step, tokenizer_corpus
from agentrl.types import Row

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "logsearch" / "logsearch_mix.toml"


def plain_step(model: torch.nn.Module, rows: list[Row], optimizer: torch.optim.Optimizer,
               max_tokens: int) -> float:
    """The step before: the model's full training forward (every position's log-prob and
    entropy) per pack, the loss read back after each pack."""
    batches = [collate(rows, [1.0] * len(rows), mb)
               for mb in pack([len(r.token_ids) for r in rows], max_tokens)]
    num_tokens = max(sum(mb.num_tokens for mb in batches), 1)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batches:
        scores = model(mb.input_ids, mb.position_ids, mb.cu_seqlens, targets=mb.target_ids)
        loss = -(scores.logprobs * mb.loss_mask).sum() / num_tokens
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def demonstration_rows(folder: Path, num: int) -> tuple[Path, list[Row]]:
    """A tiny checkpoint with a tokenizer fitted to the mix, and its demonstration rows."""
    config = load_config(CONFIG)
    policies = demonstration_policies(config, None)
    corpus = tokenizer_corpus(config, num_rollouts=100, policies=policies,
                              chat_template="compact")
    source = build_tiny_checkpoint(folder, hidden_size=128, num_layers=2, num_heads=4,
                                   num_kv_heads=2, vocab_size=1024, corpus=corpus, seed=0,
                                   chat_template="compact")
    rollouts = asyncio.run(play_demonstrations(config, load_tokenizer(source), num, 0,
                                               policies=policies, log=lambda _: None))
    return source, to_rows(rollouts)


def main() -> None:
    """Time both ways, alternating, and print the medians and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--demonstrations", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        source, rows = demonstration_rows(Path(tmp) / "base", args.demonstrations)
        longest = max(len(r.token_ids) for r in rows)
        budget = max(load_config(CONFIG).batch.max_tokens_per_microbatch, longest)
        ways: dict[str, tuple[Callable[..., float], int]] = {
            "before": (plain_step, 4 * longest), "after": (sft_step, budget)}
        models = {name: load_pretrained(source) for name in ways}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    wall: dict[str, list[float]] = {name: [] for name in ways}
    losses: dict[str, list[float]] = {name: [] for name in ways}
    rng = random.Random(0)
    for step in range(args.steps + 1):
        sample = rng.sample(rows, min(32, len(rows)))
        for name, (step_fn, max_tokens) in ways.items():
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            losses[name].append(step_fn(models[name], sample, optimizers[name], max_tokens))
            if step:  # the first step allocates the optimizer's state
                cpu[name].append(time.process_time() - start_cpu)
                wall[name].append(time.perf_counter() - start_wall)
    share = sum(r.num_generated_tokens for r in rows) / sum(len(r.token_ids) for r in rows)
    print(f"{len(rows)} rows, longest {longest} tokens, {share:.0%} of tokens generated; "
          f"32 rows a step, {args.threads} thread(s)")
    for name, (_, max_tokens) in ways.items():
        print(f"  {name}: packs of {max_tokens} tokens, {statistics.median(cpu[name]):.3f} s "
              f"CPU, {statistics.median(wall[name]):.3f} s wall per step; losses "
              f"{', '.join(f'{x:.4f}' for x in losses[name][:3])}")
    for what, seconds in (("CPU", cpu), ("wall", wall)):
        ratio = statistics.median(seconds["before"]) / statistics.median(seconds["after"])
        print(f"  {what} ratio before/after: {ratio:.2f}x")


if __name__ == "__main__":
    main()

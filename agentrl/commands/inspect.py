"""``agentrl inspect [BATCH.json | --demo]``: a batch as a worked example.

Shows each group, its rollouts, their rows with token counts, the reward copies, the
baseline and the advantage, and the counts the token-level loss normalizes by.
"""

from __future__ import annotations

import argparse

HELP = "Show a batch of rollouts: rows, reward copies, baselines and advantages."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: a saved batch, or --demo to collect one with the tiny model."""
    parser.add_argument("batch", nargs="?", help="batch JSON written by save_batch")
    parser.add_argument("--demo", action="store_true",
                        help="collect a small batch with compaction using the tiny model")
    parser.add_argument("--save", metavar="PATH", help="with --demo: also write the batch")
    parser.add_argument("--estimator", default="grpo", choices=["grpo", "rloo", "dr_grpo"])
    parser.add_argument("--scale-by-std", action="store_true",
                        help="grpo only: divide advantages by the group's std")


def run(args: argparse.Namespace) -> int:
    """Load or collect the batch and print it."""
    from agentrl.rollout.batch_io import load_batch, save_batch
    from agentrl.rollout.describe import describe_batch

    if bool(args.batch) == bool(args.demo):
        raise ValueError("give either a batch file or --demo (not both, not neither)")
    if args.demo:
        from agentrl.rollout.demo import collect_demo_batch

        rollouts = collect_demo_batch()
        if args.save:
            print(f"saved to {save_batch(args.save, rollouts)}")
    else:
        rollouts = load_batch(args.batch)
    print(describe_batch(rollouts, args.estimator, args.scale_by_std))
    return 0

"""``agentrl train CONFIG [--set k=v ...] [--out DIR] [--resume]``: run RL training."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "Train a policy with RL on the config's environments (metrics, checkpoints, resume)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, overrides, output folder, resume."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    parser.add_argument("--out", default=None,
                        help="run folder for metrics.jsonl and checkpoints "
                             "(default: runs/<config name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --out, exactly")


def run(args: argparse.Namespace) -> int:
    """Load the config, build the run, train, and print where everything went."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import load_config
    from agentrl.trainer import build_run, train

    config = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    print(describe_plan(plan_batches(config)))
    run_ = build_run(config, out, resume=args.resume)
    if args.resume:
        print(f"resuming {out} at step {run_.state.step}")
    state = train(run_)
    print(f"done: {state.step} steps, {state.cumulative_rollouts} rollouts, "
          f"{state.num_updates} updates; metrics in {out / 'metrics.jsonl'}, "
          f"checkpoints in {out / 'checkpoints'}")
    return 0

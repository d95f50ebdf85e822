"""``agentrl plan CONFIG``: print the batch accounting, or why the config cannot run."""

from __future__ import annotations

import argparse

HELP = "Print how a config's batch knobs turn collections into optimizer updates."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the config file and ``--set`` overrides."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Load and validate the config, then print the plan."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import load_config
    from agentrl.schedule import describe_lr

    config = load_config(args.config, args.overrides)
    print(f"{args.config}: valid")
    print(describe_plan(plan_batches(config)))
    print(describe_lr(config))
    rollout = config.rollout
    if rollout.max_staleness:
        inflight = ", weights swapped into running rollouts" if rollout.inflight_updates else ""
        print(f"generation: asynchronous, at most {rollout.max_staleness} policy version(s) "
              f"ahead of training{inflight}")
    return 0

"""``agentrl plan CONFIG``: print the batch accounting and the plan-time checks, or why the
config cannot run (exit status 2, one line per problem)."""

from __future__ import annotations

import argparse

HELP = ("Print how a config's batch knobs turn collections into optimizer updates, and "
        "check its environments, model folder, positions and micro-batch budget.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the config file and ``--set`` overrides."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Load and validate the config, print the plan, then run the plan-time checks."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import load_config
    from agentrl.preflight import run_checks

    config = load_config(args.config, args.overrides)
    print(f"{args.config}: valid")
    print(describe_plan(plan_batches(config)))
    print("checks:")
    for line in run_checks(config):
        print(f"  {line}")
    return 0

"""``agentrl plan CONFIG``: print the batch accounting and each environment's context
budget (its first prompt's tokens against ``compaction.max_context_tokens``), or why the
config cannot run."""

from __future__ import annotations

import argparse

HELP = ("Print how a config's batch knobs turn collections into optimizer updates, and each "
        "environment's first-prompt tokens against the context budget.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the config file and ``--set`` overrides."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Load and validate the config, print the plan and the context budget."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import ConfigError, load_config
    from agentrl.context_budget import (
        describe_budgets,
        measure_environments,
        plan_tokenizer,
        refuse_over_budget,
    )

    config = load_config(args.config, args.overrides)
    print(describe_plan(plan_batches(config)))
    try:
        tokenizer, tokenizer_name = plan_tokenizer(config)
    except ConfigError as exc:  # the model lives on another machine: plan the rest
        print(f"context budget: not measured here ({exc}; if model.path is a warm start, "
              f"`agentrl sft {args.config} --out {config.model.path}` writes it)")
    else:
        budgets = measure_environments(config, tokenizer)
        print(describe_budgets(budgets, config, tokenizer_name))
        refuse_over_budget(budgets, config)
    print(f"{args.config}: valid")
    return 0

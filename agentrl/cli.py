"""The ``agentrl`` command: one subcommand per module in ``agentrl/commands/``.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``
and keeps heavy imports (torch, the model) inside ``run`` so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from agentrl.config import ConfigError
from agentrl.parallel.caches import bound_kernel_caches

COMMANDS = {
    "plan": "agentrl.commands.plan",
    "train": "agentrl.commands.train",
    "eval": "agentrl.commands.eval",
    "sft": "agentrl.commands.sft",
    "inspect": "agentrl.commands.inspect",
    "check-env": "agentrl.commands.check_env",
    "report": "agentrl.commands.report",
    "view": "agentrl.commands.view",
    "serve": "agentrl.commands.serve",
    "export": "agentrl.commands.export",
    "serve-env": "agentrl.commands.serve_env",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Reinforcement learning for multi-turn, tool-using LLM agents. "
                    "Start with `agentrl plan CONFIG`, then `agentrl train CONFIG`.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    bound_kernel_caches()  # before any command runs a kernel
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:  # one line per problem, no traceback
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``agentrl plan CONFIG``: print the batch accounting, or why the config cannot run; with
``--gpu-memory``, also the memory plan per GPU."""

from __future__ import annotations

import argparse

HELP = ("Print how a config's batch knobs turn collections into optimizer updates, and with "
        "--gpu-memory whether a training rank fits its GPU.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the config file, ``--set`` overrides, the GPU size and rank count."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    parser.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                        help="memory of one GPU in GiB: print the memory plan per rank "
                             "(model states, activations, log-prob chunk, engine, headroom)")
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="training ranks sharing the model states (default: "
                             "train.num_ranks, or torchrun's WORLD_SIZE)")


def run(args: argparse.Namespace) -> int:
    """Load and validate the config, then print the plan (exit status 1 if it does not
    fit the GPU)."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import ConfigError, load_config

    config = load_config(args.config, args.overrides)
    print(f"{args.config}: valid")
    print(describe_plan(plan_batches(config)))
    if args.gpu_memory is None:
        return 0
    from agentrl.memory.plan import describe_memory_plan, plan_memory
    from agentrl.model.shapes import model_shape

    if not config.model.path:
        raise ConfigError("--gpu-memory plans a real model; set model.path (the tiny built-in "
                          "model needs no plan)")
    try:
        plan = plan_memory(config, model_shape(config.model.path), args.gpu_memory,
                           args.ranks or _world_size())
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(describe_memory_plan(plan))
    return 0 if plan.fits else 1


def _world_size() -> int | None:
    """torchrun's WORLD_SIZE when set, else None (then train.num_ranks)."""
    import os

    size = os.environ.get("WORLD_SIZE")
    return int(size) if size else None

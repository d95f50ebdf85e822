"""``agentrl plan CONFIG``: print the batch accounting and the plan-time checks (each
environment's context budget among them), or why the config cannot run (exit status 2, one
line per problem); with ``--gpu-memory``, also the memory plan per GPU (exit status 1 when a
rank does not fit)."""

from __future__ import annotations

import argparse
from typing import Any

HELP = ("Print how a config's batch knobs turn collections into optimizer updates, check "
        "its environments, context budget, model folder, positions and micro-batch budget, "
        "and with --gpu-memory whether a training rank fits its GPU.")


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
    """Load and validate the config, print the plan and, when asked, the memory plan (it
    needs only the model's shape, so it prints on a machine without the model), then run
    the plan-time checks. Exit status 2 when a check fails, 1 when a rank does not fit."""
    from agentrl.config import load_config
    from agentrl.config.accounting import describe_plan, plan_batches
    from agentrl.config.schedule import describe_lr
    from agentrl.train.preflight import run_checks

    config = load_config(args.config, args.overrides)
    import_environments(config)
    print(describe_plan(plan_batches(config)))
    print(describe_lr(config))
    rollout = config.rollout
    if rollout.max_staleness:
        inflight = ", weights swapped into running rollouts" if rollout.inflight_updates else ""
        where = "a process of its own" if rollout.collector == "process" else "a thread"
        print(f"generation: asynchronous, at most {rollout.max_staleness} policy version(s) "
              f"ahead of training{inflight}; the rollout side runs in {where}")
    fits = True if args.gpu_memory is None else _memory_plan(config, args)
    print("checks:")
    for line in run_checks(config):
        print(f"  {line}")
    return 0 if fits else 1


def import_environments(config: Any) -> None:
    """Import every environment's file or module (and a harness's callables) before the
    plan prints, so an import error is the one line it prints (a ConfigError per failure:
    the setting, the file, its line and the missing module)."""
    from agentrl.config import ConfigError
    from agentrl.envs.registry import load_object, resolve

    failures = []
    for index, env in enumerate(config.environments):
        harness = env.harness
        targets = {f"environments[{index}].id": env.id}
        if harness is not None:
            targets |= {f"environments[{index}].harness.run": harness.run,
                        f"environments[{index}].harness.grader": harness.grader}
        for what, target in targets.items():
            try:
                if what.endswith(".id"):
                    resolve(target)
                elif target:
                    load_object(target, what)
            except ValueError as exc:
                failures.append(f"{what}: {exc}")
    if failures:
        raise ConfigError("\n".join(failures))


def _memory_plan(config: Any, args: argparse.Namespace) -> bool:
    """Print the memory plan per GPU; True when every rank fits."""
    from agentrl.config import ConfigError
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
    from agentrl.memory.fit import describe_fit

    print(describe_fit(config, model_shape(config.model.path), args.gpu_memory,
                       plan.num_ranks))
    return plan.fits


def _world_size() -> int | None:
    """torchrun's WORLD_SIZE when set, else None (then train.num_ranks)."""
    import os

    size = os.environ.get("WORLD_SIZE")
    return int(size) if size else None

"""``agentrl eval CONFIG --checkpoint PATH``: accuracy per environment on held-out tasks;
with ``--sweep KEY=V1,V2,...`` at every cell of a grid of settings, beside baselines
(:mod:`agentrl.commands.eval_sweep`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agentrl.commands.eval_sweep import add_sweep_arguments, plan

HELP = "Evaluate a checkpoint: greedy accuracy per environment on held-out tasks (with " \
       "--sweep: over a grid of environment and compaction settings, with intervals)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, checkpoint folder, number of tasks, overrides."""
    parser.add_argument("config", help="TOML config file (its environments are evaluated)")
    parser.add_argument("--checkpoint", required=True,
                        help="a Hugging Face model folder or a LoRA checkpoint (adapter "
                             "folder), e.g. RUN/checkpoints/step_N")
    parser.add_argument("--tasks", type=int, default=None,
                        help="held-out tasks per environment (default: train.eval_tasks_per_env)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (default 0: greedy)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    add_sweep_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint into an engine and print accuracy per environment (a LoRA
    checkpoint: its base model, with the adapter synced in)."""
    import msgspec

    from agentrl.config import load_config
    from agentrl.model import load_pretrained, load_tokenizer
    from agentrl.model.peft_format import is_adapter_folder
    from agentrl.parallel.fsdp import compute_dtype, iter_full_parameters
    from agentrl.parallel.groups import local_device
    from agentrl.rollout.build import build_engine

    config = load_config(args.config, args.overrides)
    args.sweep_plan = plan(config, args) if args.sweep else None  # checked before loading
    if is_adapter_folder(args.checkpoint):
        return _evaluate_adapter(config, args)
    config = msgspec.structs.replace(
        config, model=msgspec.structs.replace(config.model, path=args.checkpoint))
    device = local_device()
    model = load_pretrained(args.checkpoint, dtype=compute_dtype(config.model.dtype, device),
                            attention=config.model.attention, device=device)
    tokenizer = load_tokenizer(args.checkpoint)
    engine = build_engine(_engine_config(config, args), model, tokenizer, args.checkpoint)
    if engine.needs_initial_sync:  # servers elsewhere: give them the checkpoint
        engine.update_weights(iter_full_parameters(model))
    return _report(engine, tokenizer, config, args)


def _evaluate_adapter(config: Any, args: argparse.Namespace) -> int:
    """A LoRA checkpoint: the engines load its base model and are sent the adapter."""
    import msgspec

    from agentrl.engines.build import build_engines
    from agentrl.model import load_tokenizer, read_args
    from agentrl.model.peft_format import read_adapter, read_adapter_config

    lora, base = read_adapter_config(args.checkpoint)
    if not Path(base).is_dir():  # the recorded base is elsewhere: the config's model
        from agentrl.train.preflight_facts import locate_model_dir

        base = str(locate_model_dir(config.model.path))
    config = msgspec.structs.replace(
        config, model=msgspec.structs.replace(config.model, path=base, lora=lora))
    tokenizer = load_tokenizer(args.checkpoint)
    engine = build_engines(_engine_config(config, args), base, tokenizer,
                           read_args(base).max_position_embeddings)
    engine.update_weights(read_adapter(args.checkpoint).items(), version=0)
    return _report(engine, tokenizer, config, args)


def _engine_config(config: Any, args: argparse.Namespace) -> Any:
    """The config the engine is built from: with ``--sweep``, one whose requests are as
    long as the longest setting's (a larger budget, the full-context baseline)."""
    if args.sweep_plan is None:
        return config
    from agentrl.commands.eval_sweep import widest

    return widest(config, args.sweep_plan[0])


def _report(engine: Any, tokenizer: Any, config: Any, args: argparse.Namespace) -> int:
    """Evaluate with ``engine`` and print accuracy per environment (or the sweep)."""
    import asyncio

    from agentrl.rollout.evaluation import evaluate
    from agentrl.rollout.template_check import prepare_chat

    prepare_chat(tokenizer, config.model)  # the model's tool-call format
    if args.sweep_plan is not None:
        from agentrl.commands.eval_sweep import run_sweep

        return run_sweep(engine, tokenizer, config, *args.sweep_plan, args)

    num_tasks = args.tasks or config.train.eval_tasks_per_env
    accuracy = asyncio.run(evaluate(engine, tokenizer, config, num_tasks, args.temperature))
    for name, value in accuracy.items():
        print(f"{name:<20} accuracy {value:.3f}  ({num_tasks} held-out tasks)")
    print(f"{'mean':<20} accuracy {sum(accuracy.values()) / len(accuracy):.3f}")
    return 0

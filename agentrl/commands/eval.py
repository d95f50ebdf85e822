"""``agentrl eval CONFIG --checkpoint PATH``: accuracy per environment on held-out tasks."""

from __future__ import annotations

import argparse

HELP = "Evaluate a checkpoint: greedy accuracy per environment on held-out tasks."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, checkpoint folder, number of tasks, overrides."""
    parser.add_argument("config", help="TOML config file (its environments are evaluated)")
    parser.add_argument("--checkpoint", required=True,
                        help="a Hugging Face model folder, e.g. RUN/checkpoints/step_N")
    parser.add_argument("--tasks", type=int, default=None,
                        help="held-out tasks per environment (default: train.eval_tasks_per_env)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (default 0: greedy)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint into an engine and print accuracy per environment."""
    import asyncio

    import msgspec

    from agentrl.config import load_config
    from agentrl.model import load_pretrained, load_tokenizer
    from agentrl.parallel.fsdp import compute_dtype, iter_full_parameters
    from agentrl.parallel.groups import local_device
    from agentrl.rollout.build import build_engine
    from agentrl.rollout.evaluation import evaluate

    config = load_config(args.config, args.overrides)
    config = msgspec.structs.replace(
        config, model=msgspec.structs.replace(config.model, path=args.checkpoint))
    device = local_device()
    model = load_pretrained(args.checkpoint, dtype=compute_dtype(config.model.dtype, device),
                            attention=config.model.attention, device=device)
    tokenizer = load_tokenizer(args.checkpoint)
    engine = build_engine(config, model, tokenizer, args.checkpoint)
    if engine.needs_initial_sync:  # servers elsewhere: give them the checkpoint
        engine.update_weights(iter_full_parameters(model))
    num_tasks = args.tasks or config.train.eval_tasks_per_env
    accuracy = asyncio.run(evaluate(engine, tokenizer, config, num_tasks, args.temperature))
    for name, value in accuracy.items():
        print(f"{name:<20} accuracy {value:.3f}  ({num_tasks} held-out tasks)")
    print(f"{'mean':<20} accuracy {sum(accuracy.values()) / len(accuracy):.3f}")
    return 0

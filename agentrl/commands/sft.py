"""``agentrl sft CONFIG --out DIR``: warm-start a model on scripted demonstrations."""

from __future__ import annotations

import argparse

HELP = ("Warm start: supervised training on correct demonstrations of the config's "
        "environments, played through the rollout runner; writes a Hugging Face folder.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, output folder, and the warm-start knobs."""
    from agentrl.sft import WarmStartConfig

    defaults = WarmStartConfig()
    parser.add_argument("config", help="TOML config (its environments and model.path)")
    parser.add_argument("--out", required=True, help="folder for the trained model")
    parser.add_argument("--base", default=None,
                        help="model folder to start from (default: a new tiny model whose "
                             "tokenizer is fitted to the environments' text)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one config setting")
    for name in ("num_steps", "rows_per_step", "num_demonstrations", "hidden_size",
                 "num_layers", "vocab_size", "warmup_steps", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            default=getattr(defaults, name), dest=name)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument("--lr-schedule", default=defaults.lr_schedule, dest="lr_schedule",
                        choices=("cosine", "linear", "constant"),
                        help="after warm-up: decay to 0 at the last step, or constant")


def run(args: argparse.Namespace) -> int:
    """Build or load the model, train it on demonstrations, save it."""

    from agentrl.config import load_config
    from agentrl.sft import WarmStartConfig, warm_start

    config = load_config(args.config, args.overrides)
    ws = WarmStartConfig(**{f: getattr(args, f) for f in WarmStartConfig.__struct_fields__})
    out = warm_start(config, args.out, ws, base=args.base)
    print(f"wrote {out}")
    return 0

"""``agentrl sft CONFIG --out DIR [--demonstrations FILE.jsonl]``: warm-start a model on
demonstrations of every environment of the config (each environment's ``demonstrate``
policy, or trajectories from JSONL files; see :mod:`agentrl.envs.demonstrations`)."""

from __future__ import annotations

import argparse

HELP = ("Warm start: supervised training on correct demonstrations of every environment of "
        "the config (its demonstrate() policy or a JSONL of trajectories), played through "
        "the rollout runner; writes a Hugging Face folder.")


NEW_MODEL_ONLY = ("hidden_size", "num_layers", "vocab_size", "chat_template")
"""Options that shape a new tiny model: they need ``--base new`` or ``--base curriculum``."""


INT_OPTIONS = {
    "num_steps": "optimizer steps of supervised training",
    "rows_per_step": "trainable rows per optimizer step",
    "num_demonstrations": "demonstration rollouts played, each environment by its weight",
    "warmup_steps": "steps of linear lr warm-up",
    "copy_steps": "steps of copy pretraining before the demonstrations (a new model that "
                  "must carry facts: ~2,000 form the circuit)",
    "keyed_steps": "steps of keyed recall (a value a few tokens after its key) after the "
                   "copy steps",
    "recall_rows": "recall rows (facts, then questions answered by name) beside every step",
    "copy_rows": "copy rows and keyed recall rows beside every step, so the demonstrations "
                 "keep the copy circuit",
    "seed": "seed of the demonstrations, the new model and the row order",
}
"""``agentrl sft``'s integer knobs (``WarmStartConfig`` fields) and their help."""

NEW_MODEL_HELP = {"hidden_size": "width", "num_layers": "decoder layers",
                  "vocab_size": "fitted tokenizer's vocabulary size"}


def resolve_base(args: argparse.Namespace) -> str | None:
    """The folder to start from (None: a new tiny model); a one-line error when a new
    model's option comes with a base, or the generic base is missing."""
    from agentrl.config import ConfigError
    from agentrl.curriculum.fitted_base import CURRICULUM
    from agentrl.model.base import generic_base

    if args.base == "new":
        return None
    if args.base == CURRICULUM:
        return CURRICULUM
    given = [n for n in NEW_MODEL_ONLY if getattr(args, n) is not None]
    if given:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in given)
        raise ConfigError(f"{flags} shape a new tiny model: add --base new or --base "
                          f"curriculum (they do not apply to --base {args.base})")
    return str(generic_base() if args.base == "base" else args.base)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, output folder, and the warm-start knobs."""
    from agentrl.curriculum.fitted_base import LAYERS
    from agentrl.train.sft import WarmStartConfig

    defaults = WarmStartConfig()
    parser.add_argument("config", help="TOML config (its environments and model.path)")
    parser.add_argument("--out", required=True, help="folder for the trained model")
    parser.add_argument("--base", default="base",
                        help="model folder to start from; default: the generic base "
                             "(assets/base, pretrained on a synthetic curriculum of long-trace "
                             "tool skills); 'new': a new tiny model whose tokenizer is fitted "
                             "to the environments' text; 'curriculum': a new tiny model "
                             "pretrained first on copying and on the drills with the "
                             "environments at a 5%% share, its tokenizer fitted to that mix "
                             "(~6 min on 2 cores; for policies that must hold beyond their "
                             "training length) (--hidden-size, --num-layers, --vocab-size "
                             "and --chat-template apply to the last two only)")
    parser.add_argument("--demonstrations", action="append", default=[], metavar="FILE.jsonl",
                        help='trajectories, one JSON per line: {"env": NAME, "seed": INT, '
                             '"actions": [...]} (repeatable); they take precedence over the '
                             "environments' demonstrate() policies")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one config setting")
    for name, text in INT_OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            default=getattr(defaults, name), dest=name,
                            help=f"{text} (default {getattr(defaults, name)})")
    for name in NEW_MODEL_ONLY[:3]:  # None: not given (they shape a --base new model only)
        default = str(getattr(defaults, name))
        if name == "num_layers":  # the curriculum base takes the generic base's depth
            default += f" with --base new, {LAYERS} with --base curriculum"
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, dest=name,
                            help=f"{NEW_MODEL_HELP[name]} of a new tiny model (--base new or "
                                 f"curriculum; default {default})")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument("--copy-lr", type=float, default=defaults.copy_lr, dest="copy_lr",
                        help="learning rate of the copy pretraining (--copy-steps)")
    add_play_arguments(parser)
    parser.add_argument("--chat-template", default=None, dest="chat_template",
                        choices=("qwen2.5", "compact"),
                        help="chat template of a new tiny model (compact: one line per tool)")
    parser.add_argument("--lr-schedule", default=defaults.lr_schedule, dest="lr_schedule",
                        choices=("cosine", "linear", "constant"),
                        help="after warm-up: decay to 0 at the last step, or constant")


def add_play_arguments(parser: argparse.ArgumentParser) -> None:
    """How demonstrations are played (``agentrl sft`` and ``agentrl check-env`` alike)."""
    from agentrl.train.sft import WarmStartConfig

    parser.add_argument("--compact-share", type=float,
                        default=WarmStartConfig().compact_share, dest="compact_share",
                        help="strategy tool: share of demonstrations that call compact "
                             "themselves; the rest leave it to the budget's fallback")
    parser.add_argument("--strategies", default="", metavar="S1,S2",
                        help="compaction strategies to play the demonstrations under, each "
                             "an equal share (e.g. tool,summarize); default: the config's")


def run(args: argparse.Namespace) -> int:
    """Build or load the model, train it on demonstrations, save it."""

    from agentrl.config import load_config
    from agentrl.curriculum.fitted_base import CURRICULUM, LAYERS
    from agentrl.envs.demonstrations import load_trajectories
    from agentrl.train.sft import WarmStartConfig, warm_start

    base = resolve_base(args)
    if args.keyed_steps and not args.copy_steps and base != CURRICULUM:
        from agentrl.config import ConfigError

        raise ConfigError(f"--keyed-steps {args.keyed_steps} follows the copy steps: add "
                          "--copy-steps N (a new model's copy stage) or --base curriculum")
    config = load_config(args.config, args.overrides)
    trajectories = load_trajectories(args.demonstrations)
    defaults = WarmStartConfig()
    fields = {f: getattr(defaults, f) if getattr(args, f) is None else getattr(args, f)
              for f in WarmStartConfig.__struct_fields__ if f != "strategies"}
    if base == CURRICULUM and args.num_layers is None:
        fields["num_layers"] = LAYERS
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    ws = WarmStartConfig(**fields, strategies=strategies)
    if base is not None:
        print(f"starting from {base}" if base != CURRICULUM else
              "starting from a new curriculum base (tokenizer fitted to the environments "
              "and the drills)")
    out = warm_start(config, args.out, ws, base=base, trajectories=trajectories)
    print(f"wrote {out}")
    return 0

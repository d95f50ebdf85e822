"""``agentrl export CHECKPOINT --out DIR [--merge] [--base BASE] [--dtype D]``: a LoRA
checkpoint as a standalone PEFT adapter folder, or with ``--merge`` as a full Hugging Face
model folder (the adapter folded into the base weights: W + (alpha / r) · B @ A) that
transformers and vLLM load without PEFT."""

from __future__ import annotations

import argparse

HELP = ("Export a LoRA checkpoint: the adapter as a PEFT folder, or with --merge a full "
        "Hugging Face model with the adapter merged into the base weights.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: the checkpoint, the output folder, --merge, the base and the dtype."""
    parser.add_argument("checkpoint", help="a LoRA checkpoint, e.g. RUN/checkpoints/step_N")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--merge", action="store_true",
                        help="write a full model (base + adapter merged) instead of the adapter")
    parser.add_argument("--base", default=None,
                        help="the base model folder (default: the checkpoint's "
                             "base_model_name_or_path)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of the merged weights (default float32)")


def run(args: argparse.Namespace) -> int:
    """Write the adapter folder or the merged model; exit status 2 on a bad checkpoint."""
    from pathlib import Path

    import torch

    from agentrl.config import ConfigError
    from agentrl.model import read_args
    from agentrl.model.checkpoint import read_checkpoint_state, save_state_dict
    from agentrl.model.lora import merged_weights
    from agentrl.model.peft_format import read_adapter, read_adapter_config, save_adapter
    from agentrl.train.checkpoint import copy_tokenizer_files

    checkpoint, out = Path(args.checkpoint), Path(args.out)
    try:
        lora, recorded_base = read_adapter_config(checkpoint)
    except ValueError as exc:
        raise ConfigError(f"{exc} (a full fine-tuning checkpoint is already a Hugging Face "
                          "model folder: nothing to export)") from None
    base = Path(args.base or recorded_base)
    if not (base / "config.json").is_file():
        raise ConfigError(f"the base model {base} of {checkpoint} has no config.json; pass "
                          "--base with the folder it was trained on")
    adapters = read_adapter(checkpoint)
    if args.merge:
        model_args = read_args(base)
        state = merged_weights(read_checkpoint_state(base, model_args), adapters, lora)
        dtype = getattr(torch, args.dtype)
        save_state_dict(model_args, {k: v.to(dtype) for k, v in state.items()}, out,
                        args.dtype)
    else:
        save_adapter(out, adapters, lora, base)
    copy_tokenizer_files(checkpoint, out)
    if not (out / "tokenizer.json").exists():
        copy_tokenizer_files(base, out)
    what = "full model (adapter merged)" if args.merge else "PEFT adapter"
    print(f"wrote {out}: {what} of {checkpoint} on {base}")
    return 0

"""The model shapes the speed benches compare at: the quickstart warm start and a random
8-layer, 512-hidden decoder with the same tokenizer (issue 25's "larger shape")."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "assets" / "calc-countdown-sft"
LARGE = {"vocab_size": 1024, "hidden_size": 512, "intermediate_size": 1536,
         "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def write_large_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A randomly initialized LARGE decoder as a HF folder (transformers, vLLM and agentrl
    load it) with the small warm start's tokenizer, special tokens and positions, so every
    framework sees the same vocabulary and stops on the same EOS."""
    from agentrl.model.args import read_args
    from agentrl.model.checkpoint import save_pretrained
    from agentrl.model.tiny import init_model

    args = msgspec.structs.replace(read_args(SMALL), **LARGE)
    path = save_pretrained(init_model(args, seed=seed), folder)
    for name in TOKENIZER_FILES:
        shutil.copy(SMALL / name, path / name)
    return path

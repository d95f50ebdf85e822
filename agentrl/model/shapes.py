"""Shapes of published checkpoints, so memory can be planned before the weights are on disk.

Values copied from each checkpoint's ``config.json``; the Instruct variants share the
base model's shape.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.model.args import ModelArgs, read_args

KNOWN_SHAPES: dict[str, ModelArgs] = {
    "Qwen2.5-1.5B": ModelArgs(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, head_dim=128,
        rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=True,
        max_position_embeddings=32768,
    ),
    "Qwen2.5-7B": ModelArgs(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
        rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=True,
        max_position_embeddings=32768,
    ),
    "Qwen2.5-14B": ModelArgs(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824,
        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=True,
        max_position_embeddings=32768,
    ),
    "Qwen2.5-32B": ModelArgs(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=27648,
        num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=True,
        max_position_embeddings=32768,
    ),
}


def model_shape(path: str | Path) -> ModelArgs:
    """The shape of the model in ``path``: its config.json, or, when the folder is not
    here, the known shape its name gives (``/models/Qwen2.5-1.5B-Instruct``)."""
    folder = Path(path)
    if (folder / "config.json").is_file():
        return read_args(folder)
    name = folder.name.removesuffix("-Instruct")
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name]
    raise ValueError(
        f"{folder} has no config.json and its name is not a known shape "
        f"({', '.join(KNOWN_SHAPES)}); give model.path as a local Hugging Face folder"
    )

"""Model hyper-parameters, read from and written to a Hugging Face ``config.json``.

Both config layouts are read: the classic one (``rope_theta`` + ``rope_scaling`` at the
top level, as shipped with Qwen2.5 / Llama 3 checkpoints) and the newer one
(``rope_parameters`` holding theta and the scaling). We write the classic layout plus
``rope_parameters``, so old and new transformers and vLLM all read our checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

SUPPORTED_FAMILIES = ("qwen2", "qwen3", "llama")
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}


class ModelArgs(msgspec.Struct, kw_only=True):
    """The shape and numerics of one decoder; field names follow HF's config.json."""

    model_type: str = "qwen2"
    """"qwen2" (Qwen2 / Qwen2.5), "qwen3" or "llama"."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    """Per-head width; Qwen3 sets it explicitly, others derive hidden_size / heads."""
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """None or {"rope_type": "linear" | "llama3" | "yarn", "factor": ..., ...}."""
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Bias on q/k/v projections (always on for qwen2)."""
    o_proj_bias: bool = False
    """Bias on the output projection (llama and qwen3 tie it to attention_bias)."""
    mlp_bias: bool = False
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (qwen3)."""
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    max_position_embeddings: int = 32768

    @property
    def eos_token_ids(self) -> list[int]:
        """The end-of-sequence ids as a list (HF allows one id or several)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)


def args_from_hf(hf: dict[str, Any]) -> ModelArgs:
    """Build ModelArgs from a parsed HF config.json dict, refusing families we cannot run."""
    model_type = hf.get("model_type", "")
    if model_type not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"config.json has model_type {model_type!r}; agentrl's native model supports "
            f"{', '.join(SUPPORTED_FAMILIES)}. Use a checkpoint of one of these families."
        )
    if hf.get("use_sliding_window"):
        raise ValueError(
            "config.json sets use_sliding_window = true; agentrl's native model only does full "
            "causal attention. Set it to false (Qwen2.5 checkpoints ship it false)."
        )
    theta, scaling = _read_rope(hf)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if model_type == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    return ModelArgs(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=qkv_bias,
        o_proj_bias=o_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type == "qwen3",
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
    )


def _read_rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None) from either config layout."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or params)
    theta = hf.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling.pop("rope_theta", None)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    scaling["rope_type"] = kind
    scaling.pop("type", None)
    return float(theta), scaling


def args_to_hf(args: ModelArgs, torch_dtype: str = "float32") -> dict[str, Any]:
    """The config.json dict transformers and vLLM expect for these args."""
    hf: dict[str, Any] = {
        "architectures": [ARCHITECTURES[args.model_type]],
        "model_type": args.model_type,
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": args.rms_norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
        "rope_parameters": {"rope_theta": args.rope_theta, "rope_type": "default"}
        | (args.rope_scaling or {}),
        "tie_word_embeddings": args.tie_word_embeddings,
        "attention_bias": args.attention_bias,
        "attention_dropout": 0.0,
        "bos_token_id": args.bos_token_id,
        "eos_token_id": args.eos_token_id,
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
        "use_cache": True,
    }
    if args.model_type == "qwen2":
        hf |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": 0}
    if args.model_type == "qwen3":
        hf |= {"use_sliding_window": False, "sliding_window": None}
    if args.model_type == "llama":
        hf |= {"mlp_bias": args.mlp_bias, "pretraining_tp": 1}
    return hf


def read_args(path: str | Path) -> ModelArgs:
    """ModelArgs from ``<path>/config.json``."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{file} does not exist; a model folder needs an HF config.json")
    return args_from_hf(json.loads(file.read_text()))

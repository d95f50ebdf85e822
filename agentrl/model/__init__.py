"""A native PyTorch decoder (Qwen2 / Qwen2.5 / Qwen3 / Llama), its checkpoints and tokenizer."""

from agentrl.model.args import ModelArgs, args_from_hf, args_to_hf, read_args
from agentrl.model.attention import (
    HAS_FLASH_ATTN,
    HAS_VARLEN,
    resolve_backend,
    varlen_attention,
)
from agentrl.model.checkpoint import load_pretrained, save_pretrained
from agentrl.model.kv_cache import KVCache
from agentrl.model.model import CausalLM, positions_from_cu_seqlens
from agentrl.model.tiny import build_tiny_checkpoint, build_tokenizer
from agentrl.model.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "HAS_FLASH_ATTN",
    "HAS_VARLEN",
    "CausalLM",
    "KVCache",
    "ModelArgs",
    "Tokenizer",
    "args_from_hf",
    "args_to_hf",
    "build_tiny_checkpoint",
    "build_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "positions_from_cu_seqlens",
    "read_args",
    "resolve_backend",
    "save_pretrained",
    "varlen_attention",
]

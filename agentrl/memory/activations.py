"""What training keeps per token and how many parameters a model has: the figures
the memory plan (:mod:`agentrl.memory.plan`) multiplies out. Every figure is in BYTES.

Per-token activation bytes follow the model code op by op (what autograd saves; ``b`` is
the compute dtype's size, H hidden, Hq = heads × head_dim, Hkv = kv heads × head_dim,
I intermediate, V vocabulary), and ``bench/memory.py`` measures the same figures:

- a decoder layer without checkpointing: two RMSNorms (fp32 input copy 4H, its norm and
  1/rms 4 + 4, normalized b·H, output b·H, each), attention (q, k, v, output, o_proj input
  b·(3·Hq + 2·Hkv), log-sum-exp 4 per head), SwiGLU MLP (gate, silu, up, product 4·b·I);
- a checkpointed layer: its input, b·H;
- once per micro-batch: the rope tables cos and sin, 2·b·head_dim;
- head and loss: input ids 8, final norm 4H + 8 + 2·b·H, targets 8, log-sum-exp 4, loss
  terms ~40; the full-logits path would add 4·V.

With ``[model.lora]`` the base is frozen, stored in the compute dtype (sharded) with no
gradient and no AdamW state; the adapters hold the 16 bytes per value of full training.
Autograd then keeps per token, in each layer, b·r for every adapter's A output (B's
gradient needs it) and, with dropout, each adapter's dropped input and mask ((b + 1)·in),
but no longer the normalized inputs of the frozen RMSNorm weights (2·b·H per layer, b·H at
the final norm) nor the input ids of the frozen embedding (8); the LM head's weight
gradient disappears from backward.
"""

from __future__ import annotations

from agentrl.model.args import ModelArgs
from agentrl.model.lora import adapter_shapes, count_adapter_parameters

LOSS_BYTES_PER_TOKEN = 40
"""The loss's own saved per-token tensors (ratio, clipped terms, masks: ~10 fp32 values)."""


def layer_bytes_per_token(args: ModelArgs, dtype_bytes: int, checkpointing: bool,
                          fp32_attention: bool = False) -> int:
    """Bytes one decoder layer saves for backward per token (see the module docstring).
    ``fp32_attention``: attention computes in fp32 over narrower activations (on a CPU,
    ``agentrl.model.attention.upcast_on_cpu``): it saves fp32 q, k, v and output."""
    b, h, i = dtype_bytes, args.hidden_size, args.intermediate_size
    if checkpointing:
        return b * h
    hq = args.num_attention_heads * args.head_dim
    hkv = args.num_key_value_heads * args.head_dim
    norms = 2 * (4 * h + 8 + 2 * b * h)  # each: fp32 copy, its norm and 1/rms, normalized
    # SDPA's q, k, v and output, o_proj's input, the log-sum-exp per head
    sdpa = 4 if fp32_attention else b
    attention = sdpa * (2 * hq + 2 * hkv) + b * hq + 4 * args.num_attention_heads
    if args.qk_norm:  # RMSNorm per head of q and k: fp32 copy, norm and 1/rms, normalized
        attention += (4 + b) * (hq + hkv) + 8 * (args.num_attention_heads
                                                  + args.num_key_value_heads)
    return norms + attention + 4 * b * i


def shared_bytes_per_token(args: ModelArgs, dtype_bytes: int) -> int:
    """The rope tables (cos, sin) every layer reads, once per micro-batch, per token."""
    return 2 * dtype_bytes * args.head_dim


def head_bytes_per_token(args: ModelArgs, dtype_bytes: int, full_logits: bool = False) -> int:
    """Input ids, final norm, LM head, log-probs and loss, per token; ``full_logits``:
    the path that returned fp32 logits [T, V] (kept for the bench's comparison)."""
    h = args.hidden_size
    chunked = 8 + (4 * h + 8 + 2 * dtype_bytes * h) + 8 + 4 + LOSS_BYTES_PER_TOKEN
    return chunked + (4 * args.vocab_size if full_logits else 0)


def saved_bytes_per_token(args: ModelArgs, dtype_bytes: int, checkpointing: bool,
                          full_logits: bool = False, fp32_attention: bool = False) -> int:
    """Autograd state per token of a micro-batch: all layers, rope tables, head and loss.
    ``fp32_attention``: as on a CPU (:func:`layer_bytes_per_token`); the plan is for GPUs."""
    return (args.num_hidden_layers * layer_bytes_per_token(args, dtype_bytes, checkpointing,
                                                           fp32_attention)
            + shared_bytes_per_token(args, dtype_bytes)
            + head_bytes_per_token(args, dtype_bytes, full_logits))


# --------------------------------------------------------------------------- parameters


def parameter_counts(args: ModelArgs) -> tuple[int, int, int]:
    """(all parameters, the root FSDP unit's: embeddings + final norm + untied head,
    one decoder layer's)."""
    h, hq = args.hidden_size, args.num_attention_heads * args.head_dim
    hkv = args.num_key_value_heads * args.head_dim
    attention = h * hq + 2 * h * hkv + hq * h
    if args.attention_bias:
        attention += hq + 2 * hkv
    if args.o_proj_bias:
        attention += h
    if args.qk_norm:
        attention += 2 * args.head_dim
    mlp = 3 * h * args.intermediate_size + (2 * args.intermediate_size + h
                                            if args.mlp_bias else 0)
    layer = attention + mlp + 2 * h
    embeddings = args.vocab_size * h
    root = embeddings * (1 if args.tie_word_embeddings else 2) + h
    return root + args.num_hidden_layers * layer, root, layer


def _shapes(args: ModelArgs, lora: object) -> list[tuple[str, tuple[int, ...]]]:
    return list(adapter_shapes(args, lora).items())  # type: ignore[arg-type]


def num_adapter_values(args: ModelArgs, lora: object) -> int:
    """Values of the LoRA adapters (0 without ``[model.lora]``)."""
    return 0 if lora is None else count_adapter_parameters(args, lora)  # type: ignore[arg-type]


def lora_bytes_per_token(args: ModelArgs, lora: object, dtype_bytes: int,
                         checkpointing: bool) -> int:
    """What LoRA adds to (or, negative, removes from) the autograd state per token of
    full training (see the module docstring); 0 without ``[model.lora]``."""
    if lora is None:
        return 0
    b, h = dtype_bytes, args.hidden_size
    head = -(b * h + 8)  # frozen final norm and embedding
    if checkpointing:
        return head
    dropout = lora.dropout > 0  # type: ignore[attr-defined]
    extra = sum(b * rank + ((b + 1) * fan_in if dropout else 0)
                for name, (rank, fan_in) in _shapes(args, lora)
                if name.endswith(".lora_A.weight"))
    return head - 2 * b * h * args.num_hidden_layers + extra

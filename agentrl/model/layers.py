"""The blocks of a decoder layer: RMSNorm, GQA attention with RoPE (cached, packed or
dense), the SwiGLU MLP and the pre-norm layer that joins them, with the per-forward
context every layer reads (:class:`LayerContext`). :mod:`agentrl.model.model` stacks them
into the causal LM."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.model.args import ModelArgs
from agentrl.model.attention import causal_attention, masked_attention, varlen_attention
from agentrl.model.cascade import PrefixPlan, cascade_attention
from agentrl.model.compile import compiled
from agentrl.model.kv_cache import KVCache, Slots
from agentrl.model.prepacked import Linear
from agentrl.model.rope import apply_rope


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, as HF does, then cast back before the weight. The mean
    square comes from one ``vector_norm`` pass (HF: ``pow(2).mean``, two): forward and
    backward 2.24 -> 1.63 ms on a 782-token micro-batch at hidden 512, equal to 1e-6."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        norm = torch.linalg.vector_norm(x32, dim=-1, keepdim=True)
        x32 = x32 * torch.rsqrt(norm.square() / x32.shape[-1] + self.eps)
        return self.weight * x32.to(dtype)


class LayerContext:
    """What every layer needs for one forward: rope angles and how to attend."""

    def __init__(
        self,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int = 0,
        cache: KVCache | None = None,
        slots: Slots | None = None,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        span: int | None = None,
        bounds: list[int] | None = None,
        deterministic: bool = False,
        valid: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
        keep_layer: int = -1,
        prefix_of: Sequence[int] | None = None,
        prefix_plan: PrefixPlan | None = None,
    ) -> None:
        self.cos, self.sin = cos, sin
        self.prefix_plan = prefix_plan
        """Batched decode: the shared prompts read once per group (cascade attention)."""
        self.prefix_of = prefix_of
        """Per packed segment, the shared prefix it attends to first (-1: none)."""
        self.cu_seqlens, self.max_seqlen, self.bounds = cu_seqlens, max_seqlen, bounds
        self.deterministic = deterministic
        self.cache, self.slots, self.positions, self.mask = cache, slots, positions, mask
        self.span, self.valid = span, valid
        self.keep, self.keep_layer = keep, keep_layer
        """``keep`` (flat indices into [B, T]): the only positions whose output layer
        ``keep_layer`` (the last) computes past its attention, [M, H] out."""


class Attention(nn.Module):
    """GQA self-attention with RoPE (and per-head q/k RMSNorm for qwen3)."""

    def __init__(self, args: ModelArgs, layer: int, backend: str) -> None:
        super().__init__()
        h, kvh, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        self.layer, self.backend = layer, backend
        self.q_proj = Linear(args.hidden_size, h * d, bias=args.attention_bias)
        self.k_proj = Linear(args.hidden_size, kvh * d, bias=args.attention_bias)
        self.v_proj = Linear(args.hidden_size, kvh * d, bias=args.attention_bias)
        self.o_proj = Linear(h * d, args.hidden_size, bias=args.o_proj_bias)
        self.qk_norm = args.qk_norm
        if args.qk_norm:
            self.q_norm = RMSNorm(d, args.rms_norm_eps)
            self.k_norm = RMSNorm(d, args.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, H, D], k and v [B, T, KVH, D] of the normed input x [B, T, hidden],
        rope applied: per-token work, the same for every way of attending."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: LayerContext
               ) -> torch.Tensor:
        """[B, T, H * D] before o_proj: cached, varlen (packed) or dense causal."""
        b, t = q.shape[:2]
        if ctx.cache is not None:
            out = self._cached(q, k, v, ctx)
        elif ctx.cu_seqlens is not None:
            out = varlen_attention(
                q[0], k[0], v[0], ctx.cu_seqlens, ctx.max_seqlen, self.backend,
                bounds=ctx.bounds, deterministic=ctx.deterministic, prefix_of=ctx.prefix_of,
            ).unsqueeze(0)
        else:
            out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            out = out.transpose(1, 2)
        return out.reshape(b, t, self.num_heads * self.head_dim)

    def _cached(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: LayerContext
    ) -> torch.Tensor:
        assert ctx.cache is not None and ctx.slots is not None and ctx.positions is not None
        keys, values = ctx.cache.write(self.layer, ctx.slots, ctx.positions, k, v, ctx.span,
                                       ctx.valid)
        queries = q.transpose(1, 2).to(keys.dtype)  # the cache may hold a wider dtype
        if ctx.prefix_plan is not None:
            out = cascade_attention(queries, keys, values, ctx.mask, ctx.prefix_plan)
        else:
            out = masked_attention(queries, keys, values, ctx.mask)
        return out.to(q.dtype).transpose(1, 2)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hid, inter, bias = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = Linear(hid, inter, bias=bias)
        self.up_proj = Linear(hid, inter, bias=bias)
        self.down_proj = Linear(inter, hid, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: ModelArgs, layer: int, backend: str) -> None:
        super().__init__()
        self.self_attn = Attention(args, layer, backend)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.activation_checkpointing = False
        """Keep only the layer's input for backward and recompute the block there."""
        self.compiled = False
        """Run the work before and after attention through ``torch.compile``
        (``agentrl.model.compile``); attention itself stays eager."""

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            # torch's non-reentrant checkpoint around the whole block, inside this
            # module's forward: FSDP2's hooks wrap the module call, outside the
            # checkpointed region, as with torch's checkpoint_wrapper (torchtitan's full
            # AC), and parameter names stay unchanged. The rope tables go in as
            # arguments so the checkpoint saves them (they live until backward anyway).
            return checkpoint(self._block, x, ctx, ctx.cos, ctx.sin, use_reentrant=False)
        return self._block(x, ctx)

    def _block(self, x: torch.Tensor, ctx: LayerContext, *_saved: torch.Tensor) -> torch.Tensor:
        # the last layer of a training forward goes on only at the positions the head
        # reads (the generated tokens): o_proj, the residual and the MLP act per
        # position, so the other positions' outputs would be computed and thrown away
        keep = ctx.keep if ctx.keep_layer == self.self_attn.layer else None
        project, finish = (compiled(layer_project), compiled(layer_finish)) if self.compiled \
            else (layer_project, layer_finish)
        q, k, v = project(self, x, ctx.cos, ctx.sin)
        return finish(self, x, self.self_attn.attend(q, k, v, ctx), keep)


def layer_project(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's work before attention: input norm, q/k/v projections, q/k norm, rope."""
    return layer.self_attn.project(layer.input_layernorm(x), cos, sin)


def layer_finish(layer: DecoderLayer, x: torch.Tensor, attended: torch.Tensor,
                 keep: torch.Tensor | None) -> torch.Tensor:
    """A layer's work after attention: o_proj, the residual, the MLP block; with ``keep``
    (flat positions [M]) only at those positions, [M, hidden] out."""
    if keep is not None:
        attended = attended.reshape(-1, attended.shape[-1]).index_select(0, keep)
        x = x.reshape(-1, x.shape[-1]).index_select(0, keep)
    x = x + layer.self_attn.o_proj(attended)
    return x + layer.mlp(layer.post_attention_layernorm(x))

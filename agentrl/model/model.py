"""A native PyTorch decoder for the Qwen2 / Qwen2.5 / Qwen3 / Llama families.

Parameter names equal Hugging Face's (``model.layers.0.self_attn.q_proj.weight`` ...), so
a checkpoint's state dict loads as is. Three ways to run it:

- ``forward(ids)``: dense rows, causal attention;
- ``forward(ids, cu_seqlens=...)``: one packed row of several rows, varlen attention that
  never crosses a row boundary (training);
- ``forward_cached(ids, slots, cache)``: append tokens to KV-cached slots (generation).

Training passes ``targets`` (and the rollout temperature) to ``forward`` and gets each
target's log-prob and the entropy back, computed from the final hidden states chunk by
chunk (``agentrl.model.logprobs``): no ``[T, V]`` logits exist. It runs inside ``forward``
(in the LM head's own ``forward``) because FSDP2 gathers the parameters of a module only
around that module's ``forward``. With activation checkpointing on, each decoder layer
keeps only its input for backward and recomputes the rest (``configure_memory``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.model.args import ModelArgs
from agentrl.model.attention import (
    causal_attention,
    masked_attention,
    resolve_backend,
    varlen_attention,
)
from agentrl.model.cascade import PrefixPlan, cascade_attention, plan_prefixes
from agentrl.model.compile import compiled
from agentrl.model.kv_cache import KVCache, Slots, cache_dtype, slot_ids
from agentrl.model.logprobs import TokenScores, chunked_target_logprobs
from agentrl.model.prepacked import Linear, linear
from agentrl.model.rope import apply_rope, inverse_frequencies, rope_cos_sin


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


class _Context:
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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: _Context
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
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: _Context
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

    def forward(self, x: torch.Tensor, ctx: _Context) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            # torch's non-reentrant checkpoint around the whole block, inside this
            # module's forward: FSDP2's hooks wrap the module call, outside the
            # checkpointed region, as with torch's checkpoint_wrapper (torchtitan's full
            # AC), and parameter names stay unchanged. The rope tables go in as
            # arguments so the checkpoint saves them (they live until backward anyway).
            return checkpoint(self._block, x, ctx, ctx.cos, ctx.sin, use_reentrant=False)
        return self._block(x, ctx)

    def _block(self, x: torch.Tensor, ctx: _Context, *_saved: torch.Tensor) -> torch.Tensor:
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


class Decoder(nn.Module):
    """HF's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs, backend: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(args, i, backend) for i in range(args.num_hidden_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class LMHead(Linear):
    """The output projection (HF's ``lm_head``). Alone: logits [..., V] in fp32. With
    targets: their log-probs and the entropy, ``chunk_tokens`` positions at a time."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)
        self.chunk_tokens = 1024
        """Positions per log-prob chunk: bounds the head's transient [chunk, V] tensors."""

    def forward(  # type: ignore[override]
        self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
        temperature: float = 1.0, with_entropy: bool = True,
        positions: torch.Tensor | None = None, padding: int = 0,
    ) -> torch.Tensor | TokenScores:
        """Logits, or TokenScores of ``targets`` [B, T]; with ``positions`` (flat [M])
        ``hidden`` holds only those positions' rows, [M, H] (the decoder's last layer
        computed no others), the last ``padding`` of them there only for the shape."""
        if targets is None:
            return linear(self, hidden).float()
        return chunked_target_logprobs(hidden, self.weight, targets, temperature,
                                       self.chunk_tokens, with_entropy, positions,
                                       picked=positions is not None, padding=padding)


class CausalLM(nn.Module):
    """Decoder + LM head. ``attention``: "auto" | "varlen" | "flash" | "torch"
    (ModelConfig.attention)."""

    def __init__(self, config: ModelArgs, attention: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.attention_backend = resolve_backend(attention)
        self.deterministic_attention = False
        """Ask the attention kernels for a deterministic backward (train.deterministic)."""
        self.compute_dtype: torch.dtype | None = None
        """Set by ``agentrl.parallel.cast.compute_in``: the dtype forwards compute in while
        the parameters stay in theirs."""
        self.model = Decoder(config, self.attention_backend)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq, self.rope_attention_factor = inverse_frequencies(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            config.max_position_embeddings,
        )
        # Not a parameter and not saved: always recomputed in fp32 from the config.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype forwards compute in: the parameters' own, or ``compute_dtype`` when set."""
        return self.compute_dtype or self.lm_head.weight.dtype

    def configure_memory(
        self, activation_checkpointing: bool, logprob_chunk_tokens: int = 1024
    ) -> None:
        """Training memory switches: checkpoint every decoder layer (recompute it in
        backward), and the positions per log-prob chunk of the training forward."""
        if logprob_chunk_tokens < 1:
            raise ValueError(f"logprob_chunk_tokens is {logprob_chunk_tokens}; it must be >= 1")
        for layer in self.model.layers:
            layer.activation_checkpointing = activation_checkpointing
        self.lm_head.chunk_tokens = logprob_chunk_tokens

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        *,
        targets: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = True,
        positions: torch.Tensor | None = None,
        bounds: Sequence[int] | None = None,
        prefix_of: Sequence[int] | None = None,
        head_padding: int = 0,
    ) -> torch.Tensor | TokenScores:
        """Logits [B, T, V] in fp32 for input_ids [B, T]; with ``targets`` [B, T] instead
        ``TokenScores``: log_softmax(logits / temperature)[target] [B, T] in fp32 and the
        entropy [B, T] (no grad; None without ``with_entropy``), without ever holding the
        [T, V] logits (training). ``positions`` (flat indices into [B, T]): the targets
        whose scores are read (the generated tokens); the head runs only there, the rest
        read 0. ``head_padding``: the last that many ``positions`` are there only to round
        their count up to a repeating shape (``MicroBatch.head_padding``); they read 0 too.

        With ``cu_seqlens`` (B must be 1) the row holds several rows back to back and
        attention stays inside each; position ids then restart at 0 per row (derived from
        cu_seqlens when not given). ``bounds``: the same boundaries as host ints (a
        ``MicroBatch``'s); given, nothing in the forward reads a device tensor back.
        ``prefix_of``: per segment of cu_seqlens, the shared prefix segment it continues
        (-1: none; ``MicroBatch.prefix_of``, :mod:`agentrl.shared_prefix`).
        """
        b, t = input_ids.shape
        max_seqlen, host_bounds = t, None
        if cu_seqlens is not None:
            host_bounds = check_bounds(cu_seqlens.tolist() if bounds is None else bounds,
                                       b, t)
            max_seqlen = max_row_length(host_bounds)
            if position_ids is None:
                position_ids = positions_from_cu_seqlens(cu_seqlens, t).unsqueeze(0)
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        cos, sin = self._rope(position_ids.to(input_ids.device))
        if targets is not None and targets.shape != input_ids.shape:
            raise ValueError(f"targets have shape {tuple(targets.shape)}; expected "
                             f"{tuple(input_ids.shape)} like input_ids")
        keep = None
        if targets is not None and positions is not None:
            if positions.dim() != 1:
                raise ValueError(f"positions have shape {tuple(positions.shape)}; expected "
                                 "one flat index per needed target, [M]")
            keep = positions.to(input_ids.device, non_blocking=True)
        ctx = _Context(cos, sin, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                       bounds=host_bounds, deterministic=self.deterministic_attention,
                       keep=keep, keep_layer=self.config.num_hidden_layers - 1,
                       prefix_of=prefix_of)
        hidden = self._hidden(input_ids, ctx)
        if targets is None:
            return self.lm_head(hidden)
        return self.lm_head(hidden, targets, temperature, with_entropy, keep,
                            head_padding if keep is not None else 0)

    def new_kv_cache(self, num_slots: int, max_len: int, capacity: int | None = None
                     ) -> KVCache:
        """An empty cache for ``num_slots`` concurrent requests of up to ``max_len`` tokens,
        ``capacity`` positions allocated now (default ``max_len``; it grows on demand)."""
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            num_slots,
            max_len,
            c.num_key_value_heads,
            c.head_dim,
            dtype=cache_dtype(self.dtype, self.lm_head.weight.device),
            device=self.lm_head.weight.device,
            capacity=capacity,
        )

    def forward_cached(
        self, input_ids: torch.Tensor, slots: Slots, cache: KVCache,
        span: int | None = None, num_new: torch.Tensor | None = None,
        last_only: bool = False, share_prefixes: bool = False,
    ) -> torch.Tensor:
        """Append row i of input_ids [N, T] to slot slots[i]; logits [N, T, V] in fp32.

        The new tokens take positions ``cache.lengths[slot] + arange(T)`` and attend to
        everything cached in their slot and causally to each other. Prefill is one or
        several prompts (right-padded, ``num_new`` [N] real tokens per row; a row with 0
        writes nothing); batched decode is the active slots with T=1. Lengths advance by
        each row's real tokens. ``slots`` as a ``range`` reads the cache in place (no
        gather). ``span``: cached positions every row's attention covers (masked past its
        own length); default the longest row's. A fixed span (``cache.max_len``) keeps
        every tensor's shape independent of which other slots share the forward.
        ``last_only``: logits [N, V] of each row's last real token only (the LM head runs
        on N positions instead of N × T). ``share_prefixes``: in a batched decode (T = 1,
        ``num_new`` given), read the positions that slots hold as copies of one another
        (a group's prompt, :meth:`KVCache.copy_prefix`) once per group
        (:mod:`agentrl.model.cascade`); the same attention to float rounding. Rows with
        no new token then get unspecified logits.
        """
        n, t = input_ids.shape
        counts = num_new.to(cache.lengths.device) if num_new is not None else None
        positions = cache.positions_for(slots, counts if counts is not None else t)
        if positions.shape != (n, t):
            raise ValueError(f"slots name {positions.shape[0]} rows of {positions.shape[1]} "
                             f"tokens; input_ids is {tuple(input_ids.shape)}")
        valid = None
        if counts is not None:
            valid = torch.arange(t, device=positions.device) < counts[:, None]
        span = min(span or int(positions.max()) + 1, cache.capacity)
        # key j may be seen by the query at position p iff j <= p: past + causal new tokens
        mask = torch.arange(span, device=positions.device) <= positions[:, :, None]
        cos, sin = self._rope(positions)
        ids = slot_ids(slots, cache.lengths.device)
        plan = None
        if share_prefixes and t == 1 and counts is not None:
            plan = plan_prefixes(ids.tolist(), (counts > 0).tolist(), cache.prefix_group,
                                 cache.prefix_len, positions.device, cache.position_bytes())
        ctx = _Context(
            cos, sin, cache=cache, slots=slots, positions=positions, mask=mask.unsqueeze(1),
            span=span, valid=valid, prefix_plan=plan,
        )
        hidden = self._hidden(input_ids, ctx)
        if counts is None:
            cache.lengths[ids] += t
        else:
            cache.lengths[ids] += counts
        if last_only:
            last = (counts - 1).clamp(min=0) if counts is not None else torch.full(
                (n,), t - 1, device=hidden.device)
            hidden = hidden[torch.arange(n, device=hidden.device), last.to(hidden.device)]
        return self.lm_head(hidden)

    def _rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(position_ids, self.inv_freq, self.rope_attention_factor, self.dtype)

    def _hidden(self, input_ids: torch.Tensor, ctx: _Context) -> torch.Tensor:
        """Final-norm hidden states [B, T, H], or [M, H] at ``ctx.keep``: what the LM
        head reads."""
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, ctx)
        return self.model.norm(x)


def check_bounds(bounds: Sequence[int], b: int, t: int) -> list[int]:
    """Row boundaries of a pack (cu_seqlens as host ints), checked: they start at 0, never
    decrease and end at the packed length ``t``; the batch holds one packed row."""
    if b != 1:
        raise ValueError(f"forward with cu_seqlens needs batch size 1 (one packed row), got {b}")
    bounds = [int(x) for x in bounds]
    lengths = [y - x for x, y in zip(bounds[:-1], bounds[1:], strict=True)]
    if not bounds or bounds[0] != 0 or bounds[-1] != t or min(lengths, default=0) < 0:
        raise ValueError(
            f"cu_seqlens {bounds} must start at 0, never decrease and end at the packed length {t}"
        )
    return bounds


def max_row_length(bounds: Sequence[int]) -> int:
    """The longest row of a pack, from its host boundaries."""
    return max((y - x for x, y in zip(bounds[:-1], bounds[1:], strict=True)), default=0)


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int | None = None
                              ) -> torch.Tensor:
    """Position ids [total] restarting at 0 at every row start of a pack. ``total`` (the
    packed length, a host int) spares reading it back from the device."""
    cu = cu_seqlens.long()
    total = int(cu[-1]) if total is None else total
    lengths = cu[1:] - cu[:-1]
    starts = torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    return torch.arange(total, device=cu.device) - starts

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
keeps only its input for backward and recomputes the rest (``configure_memory``). The
blocks of a layer (norm, attention, MLP) are :mod:`agentrl.model.layers`'.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agentrl.model.args import ModelArgs
from agentrl.model.attention import resolve_backend
from agentrl.model.cascade import plan_prefixes
from agentrl.model.kv_cache import KVCache, Slots, cache_dtype, slot_ids
from agentrl.model.layers import DecoderLayer, LayerContext, RMSNorm
from agentrl.model.logprobs import TokenScores, chunked_target_logprobs
from agentrl.model.prepacked import Linear, linear
from agentrl.model.rope import inverse_frequencies, rope_cos_sin


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
        ctx = LayerContext(cos, sin, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
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
        ctx = LayerContext(
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

    def _hidden(self, input_ids: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
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

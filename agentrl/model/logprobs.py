"""Log-probs and entropy of target tokens: one definition for the engines and the trainer.

The log-prob of token y under logits z at sampling temperature T is

    log_softmax(z / T)[y] = z[y] / T − logsumexp(z / T),   in float32,

with T = 0 (greedy) counted as T = 1. The engine reports it for each sampled token
(``target_logprobs`` on one position's logits) and the trainer recomputes it for every
target (``chunked_target_logprobs``, inside the model's forward), through the same
``_logprob_parts``, so a ratio trainer / engine starts at 1 up to the forward's rounding.

``chunked_target_logprobs`` never holds the logits of a whole micro-batch: it goes over
the final hidden states ``chunk`` tokens at a time, computes the chunk's logits
``[chunk, V]``, keeps only each target's log-prob, the log-sum-exp and the entropy, and in
backward recomputes each chunk's logits. Its autograd state is the hidden states and
4 bytes of log-sum-exp per token instead of ``[T, V]`` float32 logits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class TokenScores(NamedTuple):
    """What the training forward returns instead of logits."""

    logprobs: Tensor
    """[B, T] float32: log_softmax(logits / T)[target] per position, differentiable."""
    entropy: Tensor | None
    """[B, T] float32: entropy of softmax(logits / T) per position (no gradient); None
    when not asked for (scoring passes only need the log-probs)."""


def temperature_scale(temperature: float) -> float:
    """The divisor of the logits: the sampling temperature, or 1 for greedy (T = 0)."""
    return temperature if temperature > 0 else 1.0


def scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    """logits / T in float32 (no copy beyond the float32 cast when T is 1 or 0)."""
    z = logits.float()
    scale = temperature_scale(temperature)
    return z if scale == 1.0 else z / scale


def _logprob_parts(
    logits_nv: Tensor, targets_n: Tensor, temperature: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(scaled logits z [N, V], logsumexp(z) [N], log-prob of each target [N]): THE
    definition every path goes through."""
    z = scaled_logits(logits_nv, temperature)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, targets_n[..., None]).squeeze(-1)
    return z, lse, picked - lse


def target_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log_softmax(logits / T)[target]: logits [..., V], targets [...] → [...] float32."""
    return _logprob_parts(logits, targets, temperature)[2]


def entropy_from_scaled(z_nv: Tensor, lse_n: Tensor) -> Tensor:
    """Entropy of softmax(z) from z and its logsumexp: lse − Σ p·z (float32, [N])."""
    p = (z_nv - lse_n[:, None]).exp_()
    return lse_n - p.mul_(z_nv).sum(-1)


def chunked_target_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk: int,
    with_entropy: bool = True, positions: Tensor | None = None, picked: bool = False,
    padding: int = 0,
) -> TokenScores:
    """Log-prob and entropy of each target from final hidden states, ``chunk`` tokens at
    a time: hidden [..., H], weight (the LM head) [V, H], targets [...] → TokenScores of
    shape [...]. Exact like ``target_logprobs(hidden @ weight.T, targets, T)``; no
    ``[T, V]`` tensor exists in forward or backward, only ``[chunk, V]`` ones.

    ``positions`` (int64 [M], indices into the flattened targets): only those positions
    get the head (forward and backward); the others read 0 and pass no gradient. In
    agentic rows most tokens are prompts and tool output, which the loss never reads.
    Give them from the host (``MicroBatch.head_positions``): finding them on a GPU
    would wait for the queued forward. ``picked``: ``hidden`` already holds only the
    positions' rows, [M, H] (the model's last layer computed no others). ``padding``:
    the last ``padding`` positions only round M up to a repeating shape (positions of a
    micro-batch's padding segment, ``MicroBatch.head_padding``): computed, but they read
    0 and pass no gradient, so nothing downstream can see a value there.
    """
    if chunk < 1:
        raise ValueError(f"log-prob chunk is {chunk} tokens; train.logprob_chunk_tokens must "
                         "be >= 1")
    if picked and (positions is None or hidden.shape[:-1] != positions.shape):
        raise ValueError(f"picked hidden states have shape {tuple(hidden.shape)}; expected "
                         "one row per position, [M, H]")
    if not picked and targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets have shape {tuple(targets.shape)}; expected "
                         f"{tuple(hidden.shape[:-1])}, one target per position")
    if positions is not None and positions.dim() != 1:
        raise ValueError(f"positions have shape {tuple(positions.shape)}; expected one "
                         "flat index per needed target, [M]")
    if padding and (positions is None or not 0 <= padding <= positions.shape[0]):
        raise ValueError(f"padding of {padding} positions needs that many positions to pad "
                         f"with; got {None if positions is None else positions.shape[0]}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    index = None if positions is None else positions.to(hidden.device, non_blocking=True)
    logprobs, entropy = _ChunkedHead.apply(
        flat_hidden, weight, targets.reshape(-1), temperature, chunk, tuple(targets.shape),
        with_entropy, index, picked, padding,
    )
    return TokenScores(logprobs, entropy if with_entropy else None)


class _ChunkedHead(torch.autograd.Function):
    """hidden [N, H], weight [V, H], targets [N] → (log-probs, entropy), each [N] laid out
    in ``shape`` (the targets' own shape: returned as fresh tensors, never views, which
    FSDP2 wants of a module's outputs). With ``index`` (positions [M]) only those rows are
    computed; the others are 0 and get a zero gradient. ``picked``: hidden holds only
    those rows already, [M, H] (and so does its gradient). The last ``padding`` rows of
    ``index`` are computed but written as 0 and get no gradient.

    Saved for backward: the computed rows' hidden states, weight (a parameter), targets
    and logsumexp [M] float32. Backward recomputes each chunk's logits:
    d logprob / d z = onehot(target) − softmax(z), and z = logits / T, so d logits = that / T.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
        chunk: int, shape: tuple[int, ...], with_entropy: bool, index: Tensor | None,
        picked: bool, padding: int = 0,
    ) -> tuple[Tensor, Tensor]:
        make = hidden.new_empty if index is None else hidden.new_zeros
        logprobs_out = make(shape, dtype=torch.float32)
        entropy_out = make(shape, dtype=torch.float32) if with_entropy else \
            logprobs_out.new_empty(0)
        ctx.num_rows = None if picked else hidden.shape[0]  # None: grad stays [M, H]
        if index is not None:  # the rows to compute, packed; scattered back at the end
            targets = targets.index_select(0, index)
            if not picked:
                hidden = hidden.index_select(0, index)
        n = hidden.shape[0]
        logprobs = logprobs_out.view(-1) if index is None else logprobs_out.new_empty(n)
        entropy = entropy_out.view(-1) if index is None or not with_entropy else \
            logprobs.new_empty(n)
        lse = torch.empty_like(logprobs)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            z, lse_c, logprobs_c = _logprob_parts(
                F.linear(hidden[start:end], weight), targets[start:end], temperature
            )
            logprobs[start:end], lse[start:end] = logprobs_c, lse_c
            if with_entropy:
                entropy[start:end] = entropy_from_scaled(z, lse_c)
            del z
        if padding:  # computed only for the shape: never seen downstream
            logprobs[n - padding:] = 0.0
            if with_entropy:
                entropy[n - padding:] = 0.0
        ctx.padding = padding
        if index is not None:
            logprobs_out.view(-1).index_copy_(0, index, logprobs)
            if with_entropy:
                entropy_out.view(-1).index_copy_(0, index, entropy)
        ctx.save_for_backward(hidden, weight, targets, lse, index)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy_out)
        return logprobs_out, entropy_out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logprobs: Tensor, _grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None, None, None, None, None]:
        hidden, weight, targets, lse, index = ctx.saved_tensors
        grad_logprobs = grad_logprobs.reshape(-1)
        if index is not None:
            grad_logprobs = grad_logprobs.index_select(0, index)
        if ctx.padding:
            grad_logprobs[grad_logprobs.shape[0] - ctx.padding:] = 0.0
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight: Tensor | None = None
        scale = temperature_scale(ctx.temperature)
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(start + ctx.chunk, hidden.shape[0])
            h = hidden[start:end]
            z = scaled_logits(F.linear(h, weight), ctx.temperature)
            g = z.sub_(lse[start:end, None]).exp_().neg_()  # −softmax, in place of z
            g.scatter_add_(1, targets[start:end, None], torch.ones_like(g[:, :1]))
            g.mul_(grad_logprobs[start:end, None] / scale)
            g = g.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = g @ weight
            if ctx.needs_input_grad[1]:
                grad_weight = _accumulate(grad_weight, g.t(), h)
            del z, g
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        elif ctx.needs_input_grad[1]:  # no row needed: still a gradient, as on every rank
            grad_weight = torch.zeros_like(weight)
        if grad_hidden is not None and index is not None and ctx.num_rows is not None:
            grad_hidden = grad_hidden.new_zeros(ctx.num_rows, grad_hidden.shape[1]).index_copy_(
                0, index, grad_hidden)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


def _accumulate(total: Tensor | None, a: Tensor, b: Tensor) -> Tensor:
    """total + a @ b, summed in float32 from the second chunk on: each chunk's product is
    rounded once, like the one full-size product of the plain path (a bf16 running sum
    would round at every chunk). One chunk needs no float32 buffer at all."""
    if total is None:
        return a @ b
    if total.dtype == a.dtype == torch.float32:
        return total.addmm_(a, b)
    return total.float().add_(a @ b)

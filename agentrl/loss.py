"""The token-level clipped policy-gradient loss, as small pure functions.

Every per-token quantity is summed over the loss mask and divided by ``num_tokens``, the
generated valid tokens of the WHOLE optimizer update (all micro-batches, all ranks). So
each token weighs the same however the update is split, and the micro-batch losses (and
figures) add up to the update's: no per-micro-batch mean, no division by accumulation
steps (invariant 4 of the architecture).
"""

from __future__ import annotations

import msgspec
import torch
from torch import Tensor

from agentrl.config import LossConfig
from agentrl.model.logprobs import entropy_from_scaled, scaled_logits, target_logprobs

_CHUNK = 1024
"""Positions per chunk when reducing full logits over the vocabulary: bounds the float32
copy that log-softmax needs to [chunk, V]. (Training does not build full logits at all:
the model's forward returns the log-probs, see ``agentrl.model.logprobs``.)"""


class LossParts(msgspec.Struct):
    """Figures of one micro-batch, each a 0-dim detached tensor already divided by the
    update's token count: summing them over micro-batches and ranks gives the update's."""

    policy_loss: Tensor
    """The clipped policy-gradient term (without KL)."""
    kl_loss: Tensor
    """kl_coef × the k3 estimate of KL(π ‖ π_ref); 0 when kl_coef is 0."""
    clip_frac_low: Tensor
    """Tokens with a negative advantage whose ratio fell below 1 - clip_eps_low."""
    clip_frac_high: Tensor
    """Tokens with a positive advantage whose ratio rose above 1 + clip_eps_high."""
    approx_kl: Tensor
    """k3 estimate of KL(π_old ‖ π): how far this update has moved the policy."""
    mismatch: Tensor
    """Mean |log π_trainer − log π_engine|; on a collection's first update it is the
    pure engine-vs-trainer mismatch. 0 when engine log-probs are not given."""
    tis_weight: Tensor
    """Mean truncated importance weight min(π_old / π_engine, tis_cap)."""


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log_softmax(logits / T)[target] per position from full logits, chunk by chunk.

    logits: [B, T, V]; targets: [B, T] → [B, T] float32. The same definition as the
    engines' and the training forward's (``agentrl.model.logprobs.target_logprobs``).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    parts = [
        target_logprobs(flat[start : start + _CHUNK], flat_targets[start : start + _CHUNK],
                        temperature)
        for start in range(0, flat.shape[0], _CHUNK)
    ]
    if not parts:
        return flat.new_zeros(targets.shape, dtype=torch.float32)
    return torch.cat(parts).reshape(targets.shape)


@torch.no_grad()
def entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / T) per position: [B, T, V] → [B, T] (no grad).

    H = logsumexp(z) − Σ softmax(z)·z, chunked like ``token_logprobs``.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for start in range(0, flat.shape[0], _CHUNK):
        z = scaled_logits(flat[start : start + _CHUNK], temperature)
        parts.append(entropy_from_scaled(z, torch.logsumexp(z, dim=-1)))
    if not parts:
        return flat.new_zeros(logits.shape[:-1], dtype=torch.float32)
    return torch.cat(parts).reshape(logits.shape[:-1])


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    num_tokens: float,
    cfg: LossConfig,
    engine_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, LossParts]:
    """Σ_token (clipped PG [+ kl_coef·k3]) · mask / num_tokens, and its figures.

    Per token, with r = π/π_old and A the advantage:
    pg = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) (DAPO's asymmetric clip), times the
    detached truncated importance weight min(π_old/π_engine, tis_cap) when engine
    log-probs are given and tis_cap is set (it corrects for sampling from the engine's
    slightly different distribution). ``num_tokens`` counts the whole update's tokens.
    """
    if num_tokens <= 0:
        raise ValueError(
            f"num_tokens is {num_tokens}; pass the count of generated valid tokens of the "
            "whole update (all micro-batches and ranks), which must be > 0"
        )
    mask = mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    tis = torch.ones_like(ratio)
    if engine_logprobs is not None and cfg.tis_cap is not None:
        tis = torch.exp(old_logprobs - engine_logprobs).clamp(max=cfg.tis_cap).detach()
        pg = pg * tis
    kl = torch.zeros_like(pg)
    if ref_logprobs is not None and cfg.kl_coef != 0.0:
        kl = cfg.kl_coef * _k3(ref_logprobs - logprobs)
    loss = ((pg + kl) * mask).sum() / num_tokens

    def total(x: Tensor) -> Tensor:
        return (x.detach().float() * mask).sum() / num_tokens

    mismatch = torch.zeros_like(ratio)
    if engine_logprobs is not None:
        mismatch = (logprobs - engine_logprobs).abs()
    parts = LossParts(
        policy_loss=total(pg),
        kl_loss=total(kl),
        clip_frac_low=total(((advantages < 0) & (ratio < 1.0 - cfg.clip_eps_low)).float()),
        clip_frac_high=total(((advantages > 0) & (ratio > 1.0 + cfg.clip_eps_high)).float()),
        approx_kl=total(_k3(log_ratio)),
        mismatch=total(mismatch),
        tis_weight=total(tis),
    )
    return loss, parts


def _k3(log_ratio: Tensor) -> Tensor:
    """k3 estimator of KL(p ‖ q) from log(q/p) at samples of p: e^x − x − 1 ≥ 0, unbiased."""
    return torch.exp(log_ratio) - log_ratio - 1.0

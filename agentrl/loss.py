"""The token-level clipped policy-gradient loss, as small pure functions.

Every per-token quantity is summed over the loss mask and divided by ``num_tokens``, the
generated valid tokens of the WHOLE optimizer update (all micro-batches, all ranks). So
each token weighs the same however the update is split, and the micro-batch losses (and
figures) add up to the update's: no per-micro-batch mean, no division by accumulation
steps (invariant 4 of the architecture).

Off-policy corrections for stale data (asynchronous collection) are pieces of the same
token loss, each off unless configured: the behaviour importance weight of
``loss.objective`` (``BEHAVIOUR_WEIGHTS``: truncated IS, or AReaL's decoupled objective),
relaxed clipping of stale tokens (``clip_bounds``) and the negative-advantage veto
(``negative_advantage_veto``). None of them changes the token normalizer.
"""

from __future__ import annotations

import math

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
    """Mean behaviour importance weight (truncated IS, or the decoupled objective's)."""
    veto_frac: Tensor
    """Tokens without gradient from the negative-advantage veto; 0 when it is off."""


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
    ages: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, LossParts]:
    """Σ_token (clipped PG [+ kl_coef·k3]) · mask / num_tokens, and its figures.

    Per token, with r = π/π_old and A the advantage:
    pg = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) (DAPO's asymmetric clip), times the
    detached behaviour weight of ``cfg.objective`` (see ``BEHAVIOUR_WEIGHTS``) when engine
    log-probs are given and tis_cap is set. ``ages`` (versions behind the trained weights,
    per token) select the relaxed clip for stale tokens (``clip_bounds``); ``cu_seqlens``
    gives the rows for the negative-advantage veto. ``num_tokens`` counts the whole
    update's tokens: neither clipping nor the veto changes it.
    """
    if num_tokens <= 0:
        raise ValueError(
            f"num_tokens is {num_tokens}; pass the count of generated valid tokens of the "
            "whole update (all micro-batches and ranks), which must be > 0"
        )
    mask = mask.float()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    low, high = clip_bounds(cfg, ages)
    clipped = torch.clamp(ratio, low, high)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    weight = torch.ones_like(ratio)
    if engine_logprobs is not None and cfg.tis_cap is not None:
        weight = BEHAVIOUR_WEIGHTS[cfg.objective](old_logprobs, engine_logprobs, cfg.tis_cap)
        pg = pg * weight
    kept = torch.ones_like(ratio)
    if cfg.negative_advantage_veto is not None and engine_logprobs is not None:
        kept = negative_advantage_veto(logprobs.detach() - engine_logprobs, advantages, mask,
                                       cfg.negative_advantage_veto, cu_seqlens)
        pg = pg * kept
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
        clip_frac_low=total(((advantages < 0) & (ratio < low)).float()),
        clip_frac_high=total(((advantages > 0) & (ratio > high)).float()),
        approx_kl=total(_k3(log_ratio)),
        mismatch=total(mismatch),
        tis_weight=total(weight),
        veto_frac=total(1.0 - kept),
    )
    return loss, parts


def clip_bounds(cfg: LossConfig, ages: Tensor | None) -> tuple[Tensor | float, Tensor | float]:
    """The clip interval [low, high] of the ratio, per token where it differs.

    Fresh tokens: [1 − clip_eps_low, 1 + clip_eps_high]. With Mu-GRPO's relaxed clipping
    (Tian, Xie & Wei 2026, "How Off-Policy Can GRPO Be? μ-GRPO for Efficient LLM
    Reinforcement Learning", arXiv 2605.17570: relaxed clipping "preserves useful
    stale-rollout gradients"), tokens generated by older weights (age ≥ 1) get the wider
    interval [1 − relaxed_clip_eps_low, 1 + relaxed_clip_eps_high]: a token whose ratio
    drifted past the standard clip only because its weights are a step old keeps its
    gradient. The paper's exact schedule was not available to us; this is the
    age-gated reading, stated here so that it can be checked.
    """
    low, high = 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high
    relaxed = cfg.relaxed_clip_eps_low is not None or cfg.relaxed_clip_eps_high is not None
    if not relaxed or ages is None:
        return low, high
    relaxed_low = 1.0 - (cfg.relaxed_clip_eps_low if cfg.relaxed_clip_eps_low is not None
                         else cfg.clip_eps_low)
    relaxed_high = 1.0 + (cfg.relaxed_clip_eps_high if cfg.relaxed_clip_eps_high is not None
                          else cfg.clip_eps_high)
    stale = ages > 0
    return (torch.where(stale, relaxed_low, low).float(),
            torch.where(stale, relaxed_high, high).float())


def truncated_is_weight(old_logprobs: Tensor, engine_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling: min(π_old / π_engine, cap), detached.

    Corrects for sampling from the engine's slightly different (or older) distribution
    (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training"); the cap bounds the variance.
    """
    return torch.exp(old_logprobs - engine_logprobs).clamp(max=cap).detach()


def filtered_is_weight(proximal_logprobs: Tensor, engine_logprobs: Tensor,
                       cap: float) -> Tensor:
    """AReaL's decoupled-PPO behaviour weight: π_prox / π_engine, 0 where it exceeds cap.

    Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning": the PPO clip is taken around a proximal policy (the trainer's
    weights before the update) rather than around the stale behaviour policy, which
    enters only as this importance weight; tokens whose weight passes the cap are
    filtered out of the gradient rather than truncated.
    """
    weight = torch.exp(proximal_logprobs - engine_logprobs)
    return torch.where(weight <= cap, weight, torch.zeros_like(weight)).detach()


BEHAVIOUR_WEIGHTS = {"ppo": truncated_is_weight, "decoupled": filtered_is_weight}
"""The importance weight of each ``loss.objective``, chosen by name once per call."""


def scores_proximal_policy(cfg: LossConfig, num_updates: int) -> bool:
    """Whether a collection gets a trainer scoring pass for its old (proximal) policy:
    always for the decoupled objective; for "ppo" when the collection has several
    updates and ``old_logprobs = "score"``."""
    if cfg.objective == "decoupled":
        return True
    return num_updates > 1 and cfg.old_logprobs == "score"


def negative_advantage_veto(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, threshold: float,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """1.0 where a token keeps its gradient, 0.0 on vetoed tokens (detached, float).

    Mu-GRPO's negative-advantage veto (Tian, Xie & Wei 2026, arXiv 2605.17570) "removes
    destabilizing post-trigger suffix updates in negative-advantage responses". Our
    reading: in a row whose advantage is negative, the *trigger* is the first generated
    token whose behaviour ratio π/π_engine (``log_ratio``) leaves [1/τ, τ]; it and every
    later generated token of the same row are vetoed, because the policy being trained
    would no longer have produced that prefix, and pushing the suffix down moves
    probability mass in contexts the policy does not visit. Rows come from ``cu_seqlens``
    (packed [1, T] layout) or are the batch rows when it is None.
    """
    if threshold <= 1.0:
        raise ValueError(f"loss.negative_advantage_veto is {threshold}; it is a ratio "
                         "threshold τ and must be > 1 (e.g. 2.0)")
    trigger = ((advantages < 0) & (mask > 0) & (log_ratio.abs() > math.log(threshold)))
    counts = trigger.long().cumsum(-1)
    if cu_seqlens is not None:
        flat = counts.reshape(-1)
        bounds = cu_seqlens.to(flat.device, torch.int64)
        before = torch.cat([flat.new_zeros(1), flat])[bounds[:-1]]
        lengths = bounds[1:] - bounds[:-1]
        row_of = torch.repeat_interleave(  # output_size: no read-back of the lengths
            torch.arange(len(lengths), device=flat.device), lengths, output_size=flat.numel())
        counts = (flat - before[row_of]).reshape(counts.shape)
    return (counts == 0).float().detach()


def _k3(log_ratio: Tensor) -> Tensor:
    """k3 estimator of KL(p ‖ q) from log(q/p) at samples of p: e^x − x − 1 ≥ 0, unbiased."""
    return torch.exp(log_ratio) - log_ratio - 1.0

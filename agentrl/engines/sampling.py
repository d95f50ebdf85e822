"""Choosing the next token from logits, and the log-prob the trainer will recompute.

The log-prob returned for a sampled token is ``log_softmax(logits / temperature)`` at that
token, before top-p truncation: it is the distribution the trainer recomputes from a plain
forward (dividing its logits by the same rollout temperature), so the importance ratio
trainer/engine is 1 when the weights did not change. Greedy decoding (temperature 0)
reports ``log_softmax(logits)``, i.e. temperature 1. Top-p only decides which token is
drawn; it does not change the reported log-prob, because the trainer cannot reproduce
the truncation.
"""

from __future__ import annotations

import torch

from agentrl.model.logprobs import scaled_logits, target_logprobs


def scaled_logprobs(logits_v: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the distribution the trainer computes: log_softmax(logits / T), T=1 if 0."""
    return torch.log_softmax(scaled_logits(logits_v, temperature), dim=-1)


def top_p_mask(probs_v: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of ``probs_v`` outside the smallest set with mass >= top_p (nucleus)."""
    if top_p >= 1.0:
        return probs_v
    sorted_probs, order = torch.sort(probs_v, descending=True)
    # keep a token when the mass strictly before it is below top_p (so the top one always stays)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, probs_v, torch.zeros_like(probs_v))


def sample_token(
    logits_v: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[int, float]:
    """Draw one token from 1-D logits; return (token id, its log-prob as documented above,
    through the trainer's own definition ``agentrl.model.logprobs.target_logprobs``)."""
    if temperature <= 0:
        token = int(torch.argmax(logits_v))
    else:
        probs_v = top_p_mask(scaled_logprobs(logits_v, temperature).exp(), top_p)
        token = int(torch.multinomial(probs_v, 1, generator=generator))
    logprob = target_logprobs(logits_v, torch.tensor(token), temperature)
    return token, float(logprob)

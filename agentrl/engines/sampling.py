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

from agentrl.model.logprobs import scaled_logits


def scaled_logprobs(logits_v: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the distribution the trainer computes: log_softmax(logits / T), T=1 if 0."""
    return torch.log_softmax(scaled_logits(logits_v, temperature), dim=-1)


def top_p_mask(probs_v: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Zero the tail of ``probs_v`` [..., V] outside the smallest set with mass >= top_p
    (nucleus); ``top_p`` a float or one per row ([...] tensor)."""
    if isinstance(top_p, torch.Tensor):
        top_p = top_p[..., None]
    elif top_p >= 1.0:
        return probs_v
    sorted_probs, order = torch.sort(probs_v, descending=True)
    # keep a token when the mass strictly before it is below top_p (so the top one always stays)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, probs_v, torch.zeros_like(probs_v))


def sample_rows(
    logits_nv: torch.Tensor, temperature_n: torch.Tensor, top_p_n: torch.Tensor,
    uniform_n: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits_nv`` [N, V] at once, without a Python loop.

    Row i samples at temperature ``temperature_n[i]`` (0: greedy) from its nucleus
    ``top_p_n[i]`` by inverting the CDF at ``uniform_n[i]`` in [0, 1): the request's own
    random number for this token, drawn from its own generator when it was admitted, so
    what a request draws never depends on the other rows. Returns (tokens [N] long,
    log-probs [N] float32): log_softmax(logits / T)[token] with T = 1 for greedy, the
    definition of ``agentrl.model.logprobs`` (z[y] − logsumexp(z) in float32).
    """
    scale = torch.where(temperature_n > 0, temperature_n, torch.ones_like(temperature_n))
    z = logits_nv.float() / scale[:, None]
    lse = torch.logsumexp(z, dim=-1)
    greedy = z.argmax(dim=-1)
    tokens = greedy
    sampling = temperature_n > 0
    if bool(sampling.any()):
        probs = (z - lse[:, None]).exp_()
        if bool((top_p_n < 1.0).any()):
            probs = top_p_mask(probs, top_p_n)
        cdf = probs.cumsum_(dim=-1)
        # the first token whose cumulative mass passes u × total: exact inverse-CDF
        # sampling (right side: a zero-probability token is never drawn)
        target = (uniform_n.to(cdf.dtype) * cdf[:, -1])[:, None]
        drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        drawn = drawn.clamp_(max=logits_nv.shape[-1] - 1)
        tokens = torch.where(sampling, drawn, greedy)
    logprobs = z.gather(-1, tokens[:, None]).squeeze(-1) - lse
    return tokens, logprobs

"""Rotary position embeddings, with the linear, llama3 and yarn frequency scalings.

The formulas follow Hugging Face's ``modeling_rope_utils`` so that logits match its
models to float rounding; cos/sin are computed in fp32 and cast to the activations' dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq[head_dim/2] fp32, attention factor that multiplies cos and sin)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if scaling is None:
        return inv_freq, 1.0
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling, max_positions), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, max_positions)
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported; agentrl supports linear, llama3 and "
        "yarn. Remove rope_scaling from config.json or use a supported type."
    )


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any], max_positions: int) -> torch.Tensor:
    """Llama 3.1: divide low frequencies by factor, keep high ones, blend in between."""
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s.get("original_max_position_embeddings", max_positions))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(
    dim: int, theta: float, s: dict[str, Any], max_positions: int
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, scale attention."""
    old_len = s.get("original_max_position_embeddings", max_positions)
    factor = s.get("factor") or max_positions / old_len
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all)
        else:
            attention_factor = _mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_cos_sin(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and the signed sine :func:`apply_rope` takes, both [*position_ids.shape,
    head_dim] in ``dtype``: the sine's first half negated (HF's rotate-half sign, applied
    once per forward instead of to every q and k of every layer)."""
    freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin() * attention_factor
    sin[..., : freqs.shape[-1]].neg_()
    return (emb.cos() * attention_factor).to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, H, D] by cos/signed sine [..., T, D] from :func:`rope_cos_sin`:
    HF's ``x * cos + rotate_half(x) * sin``, with rotate_half as a roll of the halves and
    its sign in the sine: the same values bit for bit (negation is exact) without the
    negated copy and the concatenation, 1.7x faster forward and backward on a training
    micro-batch's q. (``addcmul`` would save one more pass, but its bf16 rounding made two
    ranks' LoRA training drift 30x further apart than one rank's.)"""
    cos, signed_sin = cos.unsqueeze(-2), signed_sin.unsqueeze(-2)
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin

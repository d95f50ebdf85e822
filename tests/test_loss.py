"""The token-level clipped loss against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import LossConfig
from agentrl.loss import entropy, policy_loss, token_logprobs

LN = math.log
# tokens: (advantage, ratio π/π_old, mask)
#  0: A=+1, r=1.5  above 1+0.28 with A>0: clipped high, pg = -1.28, no gradient
#  1: A=+1, r=0.5  below 1-0.2 but A>0: unclipped branch wins, pg = -0.5
#  2: A=-1, r=0.5  below 1-0.2 with A<0: clipped low, pg = +0.8, no gradient
#  3: A=-1, r=1.5  above 1+0.28 but A<0: unclipped branch wins, pg = +1.5
#  4: A=+2, r=1.1  inside the clip range, pg = -2.2
#  5: masked out (prompt token): contributes nothing
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, 5.0])
RATIO = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1, 3.0])
MASK = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
OLD = torch.tensor([-1.0, -2.0, -0.5, -1.5, -0.7, -3.0])
NUM_TOKENS = 10.0  # the whole update's tokens: other micro-batches hold the other 5


def _logprobs() -> torch.Tensor:
    return (OLD + torch.log(RATIO)).requires_grad_(True)


def _cfg(**kw: float | None) -> LossConfig:
    base = {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "kl_coef": 0.0, "tis_cap": None}
    base.update(kw)
    return LossConfig(**base)


def test_clipped_loss_value_gradient_and_clip_fractions() -> None:
    lp = _logprobs()
    loss, parts = policy_loss(lp, OLD, ADV, MASK, NUM_TOKENS, _cfg())
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5 - 2.2) / 10)
    loss.backward()
    # d(-A·r)/dlogπ = -A·r where unclipped, 0 where clipped; divided by the update's 10
    assert lp.grad.tolist() == pytest.approx([0.0, -0.05, 0.0, 0.15, -0.22, 0.0])
    assert parts.clip_frac_low.item() == pytest.approx(0.1)
    assert parts.clip_frac_high.item() == pytest.approx(0.1)
    k3 = [r - LN(r) - 1 for r in (1.5, 0.5, 0.5, 1.5, 1.1)]
    assert parts.approx_kl.item() == pytest.approx(sum(k3) / 10)
    assert parts.kl_loss.item() == 0.0
    assert parts.policy_loss.item() == pytest.approx(loss.item())


def test_kl_term_on_and_off() -> None:
    ref = OLD + torch.log(RATIO)  # equal to the policy: k3 = 0 ...
    ref[0] += LN(2.0)  # ... except token 0, where π_ref/π = 2: k3 = 2 - ln 2 - 1
    base, _ = policy_loss(_logprobs(), OLD, ADV, MASK, NUM_TOKENS, _cfg())
    off, _ = policy_loss(_logprobs(), OLD, ADV, MASK, NUM_TOKENS, _cfg(), ref_logprobs=ref)
    assert off.item() == pytest.approx(base.item())  # kl_coef 0: the reference is ignored
    lp = _logprobs()
    on, parts = policy_loss(lp, OLD, ADV, MASK, NUM_TOKENS, _cfg(kl_coef=0.1), ref_logprobs=ref)
    k3 = 2.0 - LN(2.0) - 1.0
    assert on.item() == pytest.approx(base.item() + 0.1 * k3 / 10)
    assert parts.kl_loss.item() == pytest.approx(0.1 * k3 / 10)
    on.backward()
    # d k3 / d logπ = 1 - π_ref/π = -1 on token 0; the PG term there is clipped (0)
    assert lp.grad[0].item() == pytest.approx(0.1 * -1.0 / 10)
    assert lp.grad[4].item() == pytest.approx(-0.22)


def test_truncated_importance_weight_caps_at_tis_cap() -> None:
    engine = OLD.clone()
    engine[4] = OLD[4] - LN(3.0)  # π_old/π_engine = 3 → capped at 2
    engine[1] = OLD[1] - LN(0.5)  # π_old/π_engine = 0.5 → kept
    lp = _logprobs()
    loss, parts = policy_loss(lp, OLD, ADV, MASK, NUM_TOKENS, _cfg(tis_cap=2.0),
                              engine_logprobs=engine)
    assert loss.item() == pytest.approx((-1.28 - 0.5 * 0.5 + 0.8 + 1.5 - 2.2 * 2) / 10)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -0.025, 0.0, 0.15, -0.44, 0.0])
    assert parts.tis_weight.item() == pytest.approx((1 + 0.5 + 1 + 1 + 2) / 10)
    # mismatch: |log π − log π_engine| = |ln r + ln(π_old/π_engine)| per token
    diffs = [LN(1.5), abs(LN(0.5) + LN(0.5)), LN(2.0), LN(1.5), LN(1.1) + LN(3.0)]
    assert parts.mismatch.item() == pytest.approx(sum(diffs) / 10)
    uncapped, _ = policy_loss(_logprobs(), OLD, ADV, MASK, NUM_TOKENS, _cfg(tis_cap=None),
                              engine_logprobs=engine)
    assert uncapped.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5 - 2.2) / 10)


def test_num_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        policy_loss(_logprobs(), OLD, ADV, MASK, 0, _cfg())


def test_token_logprobs_and_entropy_match_log_softmax_across_chunks() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 700, 13, dtype=torch.float64) * 3  # 1400 positions: 2 chunks
    targets = torch.randint(0, 13, (2, 700))
    reference = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets).double(), reference, atol=1e-5)
    p = torch.softmax(logits, -1)
    assert torch.allclose(entropy(logits).double(), -(p * p.log()).sum(-1), atol=1e-5)
    uniform = torch.zeros(1, 3, 8)
    assert torch.allclose(entropy(uniform), torch.full((1, 3), math.log(8)))

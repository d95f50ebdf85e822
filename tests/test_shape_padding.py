"""Micro-batches padded to a token multiple (``batch.token_multiple``) change the shapes
and nothing else.

Padding exists so that kernels built per shape (oneDNN, bf16 on a CPU) repeat from step
to step. The same rows collated with and without it give the same loss, token count,
log-probs at every real position and gradient (to float rounding), with the KL term and
shared prefixes too; the padding's own positions read 0 whatever the head computed there.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.collate_speed import dead_ends, shape_padding
from agentrl.loss import LossConfig
from agentrl.model.logprobs import chunked_target_logprobs
from agentrl.packing import collate
from agentrl.shared_prefix import pieces
from agentrl.train.update import forward_backward, score, target_scores, with_logprobs
from tests.test_shared_prefix import MODEL, group_rows
from tests.test_update import make_model

KL = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.1, tis_cap=2.0)
REFERENCE = make_model(seed=1)


def gradient_and_loss(mbs, cfg: LossConfig) -> tuple[torch.Tensor, float]:
    MODEL.zero_grad(set_to_none=True)
    stats = forward_backward(MODEL, mbs, cfg)
    return torch.cat([p.grad.reshape(-1) for p in MODEL.parameters()]), stats.loss


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), multiple=st.sampled_from([2, 8, 16, 64]),
       share=st.booleans(), groups=st.lists(
           st.tuples(st.integers(0, 24), st.integers(1, 4), st.integers(0, 1)),
           min_size=1, max_size=3))
def test_padding_changes_the_shapes_and_nothing_else(seed, multiple, share, groups) -> None:
    rng = random.Random(seed)
    rows = [r for g, (prompt_len, n, segment) in enumerate(groups)
            for r in group_rows(rng, f"g{g}", prompt_len, n, segment)]
    advantages = [rng.uniform(-1.5, 1.5) for _ in rows]
    everything = list(range(len(rows)))
    plain = collate(rows, advantages, everything, 3, share_prefixes=share)
    padded = collate(rows, advantages, everything, 3, share_prefixes=share,
                     token_multiple=multiple)

    total, real = padded.input_ids.shape[1], plain.input_ids.shape[1]
    assert total % multiple == 0 and real <= total < real + 2 * multiple
    assert padded.head_positions.numel() % multiple == 0
    assert padded.head_positions.numel() == plain.head_positions.numel() + padded.head_padding
    assert padded.head_positions.unique().numel() == padded.head_positions.numel()
    assert (padded.head_positions[plain.head_positions.numel():] >= real).all()
    assert padded.num_tokens == plain.num_tokens and padded.num_rows == plain.num_rows
    assert torch.equal(padded.loss_mask[0, :real], plain.loss_mask[0])
    assert not padded.loss_mask[0, real:].any() and not padded.advantages[0, real:].any()

    scores_plain = target_scores(MODEL, plain).logprobs
    scores_padded = target_scores(MODEL, padded).logprobs
    assert torch.allclose(scores_padded[0, :real], scores_plain[0], atol=1e-5)
    assert not scores_padded[0, real:].any()  # computed for the shape, never seen
    if plain.num_tokens == 0:
        return
    # the KL term exp(ref - logprob) would overflow at a padding position the head had
    # left unzeroed: the reference scores it 0 there
    plain, padded = ([with_logprobs([mb], score(REFERENCE, [mb]), "ref_logprobs")[0]]
                     for mb in (plain, padded))
    grad_plain, loss_plain = gradient_and_loss(plain, KL)
    grad_padded, loss_padded = gradient_and_loss(padded, KL)
    assert loss_padded == pytest.approx(loss_plain, abs=1e-6)
    assert torch.isfinite(grad_padded).all()
    # float rounding: the padded products have other row counts, so MKL may take other
    # kernels (a few ulps on gradients of order 1)
    torch.testing.assert_close(grad_padded, grad_plain, atol=1e-6, rtol=1e-6)


def test_padding_is_long_enough_to_hold_the_head_padding() -> None:
    rng = random.Random(3)
    rows = group_rows(rng, "g", 20, 4)
    segments = pieces(rows, True)
    tokens = sum(p.end - p.start for p in segments) - sum(dead_ends(segments))
    assert sum(dead_ends(segments)) == len(rows)  # every row's last token; not the prefix's
    for multiple in (1, 4, 32, 64, 128):
        padding, head_padding = shape_padding(rows, segments, multiple)
        assert (tokens + padding) % multiple == 0 and head_padding <= padding
        assert padding < 2 * multiple and head_padding < multiple
    assert shape_padding(rows, segments, 1) == (0, 0)


def test_the_head_reads_zero_and_passes_no_gradient_at_its_padding() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(12, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 40, (12,))
    real, pad = torch.tensor([1, 4, 5, 9]), torch.tensor([10, 11])
    scores = chunked_target_logprobs(hidden, weight, targets, 0.8, chunk=3, positions=real)
    padded = chunked_target_logprobs(hidden, weight, targets, 0.8, chunk=3,
                                     positions=torch.cat([real, pad]), padding=2)
    # equal to rounding (the chunks' shapes differ); exactly 0 where nothing is read
    assert torch.allclose(padded.logprobs, scores.logprobs, atol=1e-5)
    assert torch.allclose(padded.entropy, scores.entropy, atol=1e-5)
    assert not padded.logprobs[pad].any() and not padded.entropy[pad].any()
    # a downstream term that is huge at the padding positions: ignored there
    upstream = torch.full((12,), 1e6)
    upstream[real] = torch.tensor([0.5, -1.0, 2.0, 0.25])
    grads = [torch.autograd.grad((out.logprobs * upstream).sum(), (hidden, weight))
             for out in (scores, padded)]
    for ours, theirs in zip(grads[1], grads[0], strict=True):
        assert torch.allclose(ours, theirs, atol=1e-6)
    with pytest.raises(ValueError, match="padding of 5 positions"):
        chunked_target_logprobs(hidden, weight, targets, 1.0, chunk=3, positions=real,
                                padding=5)

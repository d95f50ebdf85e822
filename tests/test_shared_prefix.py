"""A group's shared prompt, held once per micro-batch, changes the work and nothing else.

The same rows collated with and without ``share_prefixes`` give the same loss, the same
token count and the same gradient (to float rounding), whatever the groups, prompt
lengths, divergence points, turn structure and validity; the shared span never holds a
trained target, and the packed micro-batch really is shorter.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.model.attention import causal_attention, prefixed_attention, varlen_attention
from agentrl.packing import collate
from agentrl.shared_prefix import (
    MIN_SHARED_TOKENS,
    packing_units,
    pieces,
    shared_length,
    unit_tokens,
)
from agentrl.train.update import UpdateStats, forward_backward
from agentrl.types import Row
from tests.test_update import CFG, VOCAB, make_model


def row(group: str, tokens: list[int], mask: list[int], k: int = 0, segment: int = 0,
        valid: bool = True) -> Row:
    return Row(rollout_id=f"{group}-{k}", group_id=group, env="e", segment=segment,
               token_ids=tokens, loss_mask=mask,
               logprobs=[-4.5 - 0.05 * (i % 7) if m else 0.0 for i, m in enumerate(mask)],
               reward=0.0, valid=valid)


def group_rows(rng: random.Random, group: str, prompt_len: int, num_rows: int,
               segment: int = 0) -> list[Row]:
    """Rows of one group: one prompt, each row maybe diverging inside it, then turns."""
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    rows = []
    for k in range(num_rows):
        tokens = list(prompt)
        if rng.random() < 0.3 and prompt_len:  # this row's prompt differs from a point on
            cut = rng.randrange(prompt_len)
            tokens[cut:] = [rng.randrange(VOCAB) for _ in range(prompt_len - cut)]
        mask = [0] * prompt_len
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(1, 6)
            tokens += [rng.randrange(VOCAB) for _ in range(n)]
            mask += [1] * n
            n = rng.randint(0, 3)
            tokens += [rng.randrange(VOCAB) for _ in range(n)]
            mask += [0] * n
        rows.append(row(group, tokens, mask, k, segment, valid=rng.random() > 0.1))
    return rows


def gradient(model, mbs) -> tuple[torch.Tensor, float]:
    grad, stats = gradient_and_stats(model, mbs)
    return grad, stats.loss


def gradient_and_stats(model, mbs) -> tuple[torch.Tensor, UpdateStats]:
    model.zero_grad(set_to_none=True)
    stats = forward_backward(model, mbs, CFG)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), stats


MODEL = make_model()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), groups=st.lists(
    st.tuples(st.integers(0, 24), st.integers(1, 4), st.integers(0, 1)), min_size=1,
    max_size=3))
def test_sharing_changes_no_loss_no_token_count_and_no_gradient(seed, groups) -> None:
    rng = random.Random(seed)
    rows = [r for g, (prompt_len, n, segment) in enumerate(groups)
            for r in group_rows(rng, f"g{g}", prompt_len, n, segment)]
    rng.shuffle(rows)  # a group's rows need not sit together in the batch
    advantages = [rng.uniform(-1.5, 1.5) for _ in rows]
    everything = list(range(len(rows)))
    plain = collate(rows, advantages, everything, 3)
    shared = collate(rows, advantages, everything, 3, share_prefixes=True)
    assert shared.num_tokens == plain.num_tokens
    assert shared.num_rows == plain.num_rows == len(rows)
    assert torch.equal(shared.loss_mask.sum(), plain.loss_mask.sum())
    assert torch.allclose(shared.advantages.sum(), plain.advantages.sum(), atol=1e-5)
    if plain.num_tokens == 0:
        return
    grad_plain, stats = gradient_and_stats(MODEL, [plain])
    grad_shared, loss_shared = gradient(MODEL, [shared])
    assert loss_shared == pytest.approx(stats.loss, abs=1e-6)
    assert torch.allclose(grad_shared, grad_plain, atol=1e-6, rtol=0)
    # not a comparison of zeros: some token passes the clip (the rows' old log-probs are
    # fixed, so a few short rows can have every token clipped, and then no gradient)
    clipped = stats.clip_frac_low + stats.clip_frac_high
    assert grad_plain.abs().max() > 1e-4 or not any(r.valid for r in rows) or clipped > 0.999


def test_a_group_of_eight_with_a_long_prompt_is_packed_into_far_fewer_tokens() -> None:
    rng = random.Random(0)
    rows = group_rows(rng, "g", 40, 8)
    rows = [row("g", rows[0].token_ids[:40] + r.token_ids[40:], r.loss_mask, k)
            for k, r in enumerate(rows)]  # no row diverges: all share the whole prompt
    everything = list(range(len(rows)))
    plain = collate(rows, [1.0] * 8, everything)
    shared = collate(rows, [1.0] * 8, everything, share_prefixes=True)
    # the prompt's first 39 tokens once, then each row from its last prompt token on
    assert shared.input_ids.shape[1] == plain.input_ids.shape[1] - 7 * 39
    assert shared.prefix_of == (-1,) + (0,) * 8
    assert shared.position_ids[0, 39].item() == 39  # the first row's own part goes on at 39
    grad_plain, _ = gradient(MODEL, [plain])
    grad_shared, _ = gradient(MODEL, [shared])
    assert torch.allclose(grad_shared, grad_plain, atol=1e-6, rtol=0)


def test_the_shared_span_stops_before_the_first_trained_target() -> None:
    prompt = list(range(1, 13))  # 12 prompt tokens
    a = row("g", prompt + [50, 51], [0] * 12 + [1, 1])
    b = row("g", prompt + [60], [0] * 12 + [1])
    assert shared_length([a, b]) == 11  # the last prompt token stays in each row
    early = row("g", prompt + [70], [0] * 5 + [1] * 8)  # generated from token 5 on
    assert shared_length([a, early]) == 0  # 4 tokens: under MIN_SHARED_TOKENS
    apart = row("g", prompt[:9] + [99, 98, 97, 96], [0] * 12 + [1])
    assert shared_length([a, apart]) == 8  # diverges at 9: tokens 0..7 shared
    assert shared_length([a]) == 0  # one row has nothing to share with
    assert MIN_SHARED_TOKENS == 8


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), prompt_len=st.integers(0, 30), n=st.integers(1, 6))
def test_no_trained_target_ever_lies_in_a_shared_span(seed, prompt_len, n) -> None:
    rows = group_rows(random.Random(seed), "g", prompt_len, n)
    span = shared_length(rows)
    assert span == 0 or span >= MIN_SHARED_TOKENS
    for r in rows if span else []:  # nothing shared: nothing to check here
        # positions 0 .. span-1 predict tokens 1 .. span: none of them generated, and
        # every row holds the same tokens there
        assert not any(r.loss_mask[: span + 1])
        assert r.token_ids[: span + 1] == rows[0].token_ids[: span + 1]
    own = [p for p in pieces(rows, share=True) if p.prefix >= 0 or span == 0]
    # every row exactly once, from the span on, to its end
    assert sorted((p.row, p.start, p.end) for p in own) == [
        (i, span, len(r.token_ids)) for i, r in enumerate(rows)]


def test_a_unit_over_the_budget_is_placed_row_by_row() -> None:
    rows = group_rows(random.Random(1), "g", 20, 4)
    rows = [row("g", rows[0].token_ids[:20] + r.token_ids[20:], r.loss_mask, k)
            for k, r in enumerate(rows)]
    tokens = unit_tokens(rows, range(4))
    assert tokens == 19 + sum(len(r.token_ids) - 19 for r in rows)
    units, lengths = packing_units(rows, range(4), tokens)
    assert units == [[0, 1, 2, 3]] and lengths == [tokens]
    units, lengths = packing_units(rows, range(4), tokens - 1)
    assert units == [[0], [1], [2], [3]] and lengths == [len(r.token_ids) for r in rows]


def test_prefixed_attention_equals_causal_attention_over_the_whole_row() -> None:
    torch.manual_seed(0)
    prefix, own, heads, kv_heads, dim = 7, 5, 4, 2, 8
    q = torch.randn(1, heads, prefix + own, dim)
    k, v = torch.randn(2, 1, kv_heads, prefix + own, dim)
    whole = causal_attention(q, k, v)[:, :, prefix:]
    assert torch.allclose(prefixed_attention(q[:, :, prefix:], k, v), whole, atol=1e-6)
    # and through the packed entry point: [prefix][row a's own][row b's own]
    qa, qb = torch.randn(2, own, heads, dim)
    kp, ka, kb = torch.randn(3, prefix, kv_heads, dim)
    vp, va, vb = torch.randn(3, prefix, kv_heads, dim)
    bounds = [0, prefix, prefix + own, prefix + 2 * own]
    packed = varlen_attention(
        torch.cat([q[0].transpose(0, 1)[:prefix], qa, qb]), torch.cat([kp, ka[:own], kb[:own]]),
        torch.cat([vp, va[:own], vb[:own]]), torch.tensor(bounds), own, "torch", bounds,
        prefix_of=[-1, 0, 0])
    for out, qr, kr, vr in ((packed[prefix:prefix + own], qa, ka[:own], va[:own]),
                            (packed[prefix + own:], qb, kb[:own], vb[:own])):
        full_q = torch.cat([q[0].transpose(0, 1)[:prefix], qr]).transpose(0, 1)[None]
        full_k = torch.cat([kp, kr]).transpose(0, 1)[None]
        full_v = torch.cat([vp, vr]).transpose(0, 1)[None]
        expect = causal_attention(full_q, full_k, full_v)[0, :, prefix:].transpose(0, 1)
        assert torch.allclose(out, expect, atol=1e-6)

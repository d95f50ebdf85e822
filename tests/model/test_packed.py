"""Packing never lets attention cross rows: a packed forward equals the per-row forwards."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.model import load_pretrained, positions_from_cu_seqlens, varlen_attention
from agentrl.model.attention import equal_runs, length_buckets


@pytest.fixture(scope="module", params=["tiny_qwen2", "tiny_qwen3"])
def model(request):
    return load_pretrained(request.getfixturevalue(request.param)).eval()


def pack(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([0] + [len(r) for r in rows])
    return torch.cat(rows).unsqueeze(0), torch.cumsum(lengths, 0).to(torch.int32)


def test_packed_forward_equals_per_row(model):
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 500, (n,), generator=gen) for n in (7, 1, 13, 4)]
    ids, cu = pack(rows)
    with torch.no_grad():
        packed = model(ids, cu_seqlens=cu)[0]
        for i, row in enumerate(rows):
            alone = model(row.unsqueeze(0))[0]
            assert torch.allclose(packed[cu[i] : cu[i + 1]], alone, atol=1e-5, rtol=0)


def test_changing_row_zero_leaves_row_one_alone(model):
    gen = torch.Generator().manual_seed(1)
    row0, row1 = (
        torch.randint(0, 500, (9,), generator=gen),
        torch.randint(0, 500, (6,), generator=gen),
    )
    ids, cu = pack([row0, row1])
    other = ids.clone()
    other[0, :9] = (other[0, :9] + 17) % 500
    with torch.no_grad():
        a, b = model(ids, cu_seqlens=cu)[0], model(other, cu_seqlens=cu)[0]
        # and without cu_seqlens the same change does reach row 1: the test can fail
        c, d = model(ids)[0], model(other)[0]
    assert not torch.allclose(a[:9], b[:9])
    assert torch.equal(a[9:], b[9:])
    assert not torch.allclose(c[9:], d[9:])


def test_explicit_position_ids_equal_derived(model):
    rows = [torch.arange(5), torch.arange(10, 18)]
    ids, cu = pack(rows)
    positions = torch.cat([torch.arange(5), torch.arange(8)]).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(model(ids, cu_seqlens=cu), model(ids, positions, cu))


def test_positions_restart_per_row():
    cu = torch.tensor([0, 3, 3, 7, 8])
    assert positions_from_cu_seqlens(cu).tolist() == [0, 1, 2, 0, 1, 2, 3, 0]


def test_bad_cu_seqlens_are_refused(model):
    ids = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="end at the packed length 6"):
        model(ids, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="batch size 1"):
        model(torch.zeros(2, 3, dtype=torch.long), cu_seqlens=torch.tensor([0, 3]))


def reference_attention(q, k, v, cu):
    """Naive softmax attention with an explicit block-diagonal causal mask (fp64)."""
    total, heads, dim = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    row = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    pos = torch.arange(total)
    allowed = (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / dim**0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v.double())


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(lambda x: sum(x) > 0),
    kv_heads=st.sampled_from([1, 2, 4]),
)
def test_varlen_attention_matches_reference(lengths, kv_heads):
    gen = torch.Generator().manual_seed(sum(lengths))
    total = sum(lengths)
    q = torch.randn(total, 4, 8, generator=gen)
    k = torch.randn(total, kv_heads, 8, generator=gen)
    v = torch.randn(total, kv_heads, 8, generator=gen)
    cu = torch.cumsum(torch.tensor([0, *lengths]), 0)
    got = varlen_attention(q, k, v, cu, max(lengths))
    assert torch.allclose(got.double(), reference_attention(q, k, v, cu), atol=1e-5)


def test_varlen_attention_backward_matches_reference():
    gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 5, 12, 13])
    leaves = [torch.randn(13, h, 8, generator=gen, requires_grad=True) for h in (4, 2, 2)]
    varlen_attention(*leaves, cu, 7).square().sum().backward()
    ours = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    reference_attention(*leaves, cu).square().sum().backward()
    for a, t in zip(ours, leaves, strict=True):
        assert torch.allclose(a, t.grad.float(), atol=1e-5)


def test_packed_gradients_equal_per_row_gradients(tiny_qwen2):
    """Training through the packed path gives the per-row gradients (sum over rows)."""
    model = load_pretrained(tiny_qwen2)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied stays tied
    gen = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, 500, (n,), generator=gen) for n in (6, 11, 3)]
    ids, cu = pack(rows)
    model(ids, cu_seqlens=cu).logsumexp(-1).sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for row in rows:
        model(row.unsqueeze(0)).logsumexp(-1).sum().backward()
    for name, param in model.named_parameters():
        assert torch.allclose(packed[name], param.grad, atol=1e-5, rtol=1e-4), name


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=30))
def test_length_buckets_cover_each_row_once_with_one_length_each(lengths):
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == [i for i, n in enumerate(lengths) if n]
    assert all(len({lengths[i] for i in bucket}) == 1 for bucket in buckets)
    assert len(buckets) == len({n for n in lengths if n})


def test_bucketed_attention_and_its_gradients_match_the_reference():
    """Rows of equal length share one stacked SDPA call, in any order in the pack;
    forward and backward still equal the masked fp64 reference."""
    lengths = [9, 9, 8, 0, 9, 3, 9, 1, 8, 17, 16, 9]
    assert any(len(b) > 1 for b in length_buckets(lengths))  # the stacked path runs
    assert any(len(b) == 1 for b in length_buckets(lengths))  # and the single-row one
    gen = torch.Generator().manual_seed(5)
    total = sum(lengths)
    leaves = [torch.randn(total, h, 8, generator=gen, requires_grad=True) for h in (4, 2, 2)]
    cu = torch.cumsum(torch.tensor([0, *lengths]), 0)
    weights = torch.randn(total, 4, 8, generator=gen)
    out = varlen_attention(*leaves, cu, max(lengths))
    (out * weights).sum().backward()
    ours = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    expected = reference_attention(*leaves, cu)
    (expected * weights.double()).sum().backward()
    assert torch.allclose(out.double(), expected, atol=1e-5)
    for a, t in zip(ours, leaves, strict=True):
        assert torch.allclose(a, t.grad.float(), atol=1e-5)


@pytest.mark.parametrize("prefixed", [False, True])
def test_bf16_attention_on_a_cpu_is_the_float32_attention_rounded(prefixed):
    """bf16 inputs on a CPU attend in float32 (torch's bf16 SDPA is slower there and
    rounds its softmax): the output is the float32 result rounded to bf16, and gradients
    come back in bf16 close to the float32 ones."""
    lengths, prefix_of = ([6, 4, 4, 3], [-1, 0, 0, 0]) if prefixed else ([5, 9, 2], None)
    gen = torch.Generator().manual_seed(7)
    total = sum(lengths)
    leaves = [torch.randn(total, h, 8, generator=gen) for h in (4, 2, 2)]
    cu = torch.cumsum(torch.tensor([0, *lengths]), 0)
    half = [t.bfloat16().requires_grad_() for t in leaves]
    full = [t.detach().float().requires_grad_() for t in half]
    out = varlen_attention(*half, cu, max(lengths), "torch", prefix_of=prefix_of)
    expected = varlen_attention(*full, cu, max(lengths), "torch", prefix_of=prefix_of)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.bfloat16())
    out.float().square().sum().backward()
    expected.square().sum().backward()
    for a, b in zip(half, full, strict=True):
        assert a.grad.dtype == torch.bfloat16
        assert torch.allclose(a.grad.float(), b.grad, atol=0.05, rtol=0.05)


def prefixed_reference(q, k, v, bounds, prefix_of):
    """fp64 attention where a segment sees its own earlier tokens and, when it continues a
    prefix segment, all of that segment's tokens first."""
    total, heads, dim = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1).double()
    v = v.repeat_interleave(heads // v.shape[1], dim=1).double()
    lengths = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    parent = torch.tensor(prefix_of)[segment]
    pos = torch.arange(total)
    allowed = ((segment[:, None] == segment[None, :]) & (pos[None, :] <= pos[:, None])) | (
        parent[:, None] == segment[None, :])
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / dim**0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


@settings(max_examples=40, deadline=None)
@given(units=st.lists(st.tuples(st.integers(0, 5),
                                st.lists(st.sampled_from([1, 3, 4, 4, 4]), min_size=1,
                                         max_size=5)), min_size=1, max_size=4),
       kv_heads=st.sampled_from([1, 2]))
def test_rows_after_shared_prefixes_attend_like_the_reference(units, kv_heads):
    """Rows of one length back to back (a run, attended as a view of the pack), rows
    alone (stacked by length), with and without a shared prefix before them: outputs and
    gradients equal the fp64 reference."""
    lengths, prefix_of = [], []
    for prefix, rows in units:
        parent = -1
        if prefix:
            prefix_of.append(-1)
            lengths.append(prefix)
            parent = len(lengths) - 1
        for n in rows:
            prefix_of.append(parent)
            lengths.append(n)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    gen = torch.Generator().manual_seed(len(lengths) * 31 + bounds[-1])
    leaves = [torch.randn(bounds[-1], h, 8, generator=gen, requires_grad=True)
              for h in (4, kv_heads, kv_heads)]
    weights = torch.randn(bounds[-1], 4, 8, generator=gen)
    out = varlen_attention(*leaves, torch.tensor(bounds), max(lengths), "torch", bounds,
                           prefix_of=prefix_of)
    (out * weights).sum().backward()
    ours = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    expected = prefixed_reference(*leaves, bounds, prefix_of)
    (expected * weights.double()).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    for a, t in zip(ours, leaves, strict=True):
        torch.testing.assert_close(a, t.grad.float(), atol=1e-5, rtol=0)


def test_equal_runs_keep_a_continued_prefix_alone():
    # [prefix 6][4][4][4][3][prefix 6][4][4] and two unshared rows of 5
    lengths = [6, 4, 4, 4, 3, 6, 4, 4, 5, 5]
    parents = [-1, 0, 0, 0, 0, -1, 5, 5, -1, -1]
    assert equal_runs(lengths, parents) == [[0], [1, 2, 3], [4], [5], [6, 7], [8, 9]]
    # a prefix never joins the unshared rows of its length before it
    assert equal_runs([3, 3, 2], [-1, -1, 1]) == [[0], [1], [2]]


@pytest.mark.parametrize("lengths, viewed", [([5, 4, 4, 4, 3], True), ([5, 4, 3, 4], False)])
def test_a_run_of_rows_is_attended_in_place_and_lone_rows_are_stacked(lengths, viewed):
    """Where some rows of one length sit back to back after one prefix, attention reads
    every row straight from the pack (backward keeps the pack's q, not copies of it);
    otherwise rows of one length are stacked into copies, one call each."""
    prefix_of = [-1] + [0] * (len(lengths) - 1)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    q, k, v = (torch.randn(bounds[-1], h, 8, requires_grad=True) for h in (4, 2, 2))
    saved = set()

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        varlen_attention(q, k, v, torch.tensor(bounds), max(lengths), "torch", bounds,
                         prefix_of=prefix_of)
    assert (q.untyped_storage().data_ptr() in saved) is viewed


def test_a_pack_of_empty_rows_attends_to_nothing():
    q, k, v = (torch.randn(0, h, 8) for h in (4, 2, 2))
    out = varlen_attention(q, k, v, torch.tensor([0, 0, 0]), 0, "torch", [0, 0, 0])
    assert out.shape == (0, 4, 8)

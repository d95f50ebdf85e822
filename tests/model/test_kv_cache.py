"""KV-cached decoding gives the logits of the uncached forward (fp32, within 1e-5)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained
from agentrl.model.attention import masked_attention
from agentrl.model.kv_cache import cache_dtype

TOL = 1e-5


@pytest.fixture(scope="module", params=["tiny_qwen2", "tiny_qwen3"])
def model(request):
    return load_pretrained(request.getfixturevalue(request.param)).eval()


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_prefill_then_step_decode_equals_full_forward(model):
    seq = tokens(16, 0)
    full = model(seq.unsqueeze(0))[0]
    cache = model.new_kv_cache(num_slots=2, max_len=32)
    slot = torch.tensor([1])
    out = [model.forward_cached(seq[:6].unsqueeze(0), slot, cache)[0]]
    for t in range(6, 16):
        out.append(model.forward_cached(seq[t : t + 1].unsqueeze(0), slot, cache)[0])
    assert torch.allclose(torch.cat(out), full, atol=TOL, rtol=0)
    assert cache.lengths.tolist() == [0, 16]


@torch.no_grad()
def test_slots_of_different_lengths_decode_together(model):
    seqs = {0: tokens(12, 1), 2: tokens(5, 2), 3: tokens(9, 3)}
    prompt_len = {0: 7, 2: 1, 3: 4}
    cache = model.new_kv_cache(num_slots=4, max_len=16)
    got: dict[int, list[torch.Tensor]] = {}
    for slot, seq in seqs.items():
        p = prompt_len[slot]
        got[slot] = [model.forward_cached(seq[:p].unsqueeze(0), torch.tensor([slot]), cache)[0]]
    # decode one token per active slot per step; slots end at different times
    for step in range(11):
        active = [s for s in seqs if prompt_len[s] + step < len(seqs[s])]
        if not active:
            break
        ids = torch.stack(
            [seqs[s][prompt_len[s] + step : prompt_len[s] + step + 1] for s in active]
        )
        logits = model.forward_cached(ids, torch.tensor(active), cache)
        for i, s in enumerate(active):
            got[s].append(logits[i])
    for slot, seq in seqs.items():
        expected = model(seq.unsqueeze(0))[0]
        assert torch.allclose(torch.cat(got[slot]), expected, atol=TOL, rtol=0), slot
    assert cache.lengths.tolist() == [12, 0, 5, 9]


@torch.no_grad()
def test_multi_token_append_to_live_slots(model):
    """An observation of several tokens appended to two slots at once."""
    a, b = tokens(14, 4), tokens(14, 5)
    cache = model.new_kv_cache(num_slots=2, max_len=20)
    model.forward_cached(a[:5].unsqueeze(0), torch.tensor([0]), cache)
    model.forward_cached(b[:8].unsqueeze(0), torch.tensor([1]), cache)
    # same T for both rows, different histories
    ids = torch.stack([a[5:9], b[8:12]])
    logits = model.forward_cached(ids, torch.tensor([0, 1]), cache)
    assert torch.allclose(logits[0], model(a[:9].unsqueeze(0))[0, 5:], atol=TOL, rtol=0)
    assert torch.allclose(logits[1], model(b[:12].unsqueeze(0))[0, 8:], atol=TOL, rtol=0)


@torch.no_grad()
def test_reset_reuses_a_slot(model):
    cache = model.new_kv_cache(num_slots=1, max_len=10)
    model.forward_cached(tokens(9, 6).unsqueeze(0), torch.tensor([0]), cache)
    cache.reset(0)
    seq = tokens(6, 7)
    got = model.forward_cached(seq.unsqueeze(0), torch.tensor([0]), cache)
    assert torch.allclose(got[0], model(seq.unsqueeze(0))[0], atol=TOL, rtol=0)


def test_overflow_is_refused_with_the_slot_named(model):
    cache = model.new_kv_cache(num_slots=2, max_len=8)
    with torch.no_grad():
        model.forward_cached(tokens(6, 8).unsqueeze(0), torch.tensor([1]), cache)
        with pytest.raises(ValueError, match="slot 1 holds 6 tokens; adding 3 .*max_len=8"):
            model.forward_cached(tokens(3, 9).unsqueeze(0), torch.tensor([1]), cache)
    assert cache.lengths.tolist() == [0, 6]


def test_duplicate_slots_are_refused(model):
    cache = model.new_kv_cache(num_slots=2, max_len=8)
    with pytest.raises(ValueError, match="each slot once"):
        model.forward_cached(torch.zeros(2, 1, dtype=torch.long), torch.tensor([0, 0]), cache)


@torch.no_grad()
def test_cache_grows_on_demand_and_keeps_what_it_holds(model):
    seq = tokens(100, 7)
    full = model(seq.unsqueeze(0))[0]
    cache = model.new_kv_cache(num_slots=2, max_len=128, capacity=8)
    small = cache.nbytes()
    assert cache.capacity < 128
    slot = torch.tensor([0])
    out = [model.forward_cached(seq[:5].unsqueeze(0), slot, cache)[0]]
    for t in range(5, 100):  # passes 8, 64 ... : each growth copies the filled part
        out.append(model.forward_cached(seq[t : t + 1].unsqueeze(0), slot, cache)[0])
    assert torch.allclose(torch.cat(out), full, atol=TOL, rtol=0)
    assert 100 <= cache.capacity <= 128 and cache.nbytes() > small


@torch.no_grad()
def test_padded_batch_prefill_equals_one_prompt_at_a_time(model):
    prompts = [tokens(9, 11), tokens(3, 12), tokens(6, 13)]
    cache = model.new_kv_cache(num_slots=3, max_len=32)
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([p, torch.zeros(width - len(p), dtype=torch.long)])
                       for p in prompts])
    counts = torch.tensor([len(p) for p in prompts])
    last = model.forward_cached(ids, torch.tensor([2, 0, 1]), cache, num_new=counts,
                                last_only=True)
    assert cache.lengths.tolist() == [3, 6, 9]
    for row, prompt in enumerate(prompts):
        assert torch.allclose(last[row], model(prompt.unsqueeze(0))[0, -1], atol=TOL, rtol=0)
    # then one decode step over the slots as a range (read in place) with a row left out
    nxt = torch.tensor([[4], [5], [6]])
    step = model.forward_cached(nxt, range(3), cache, num_new=torch.tensor([1, 0, 1]))
    assert cache.lengths.tolist() == [4, 6, 10]
    for slot, prompt in ((2, prompts[0]), (0, prompts[1])):
        ref = model(torch.cat([prompt, nxt[slot]]).unsqueeze(0))[0, -1]
        assert torch.allclose(step[slot, -1], ref, atol=TOL, rtol=0)


@torch.no_grad()
def test_copy_prefix_gives_another_slot_the_same_cache(model):
    seq = tokens(10, 21)
    cache = model.new_kv_cache(num_slots=2, max_len=16)
    model.forward_cached(seq[:8].unsqueeze(0), torch.tensor([0]), cache)
    cache.copy_prefix(0, 1, 8)
    a = model.forward_cached(seq[8:].unsqueeze(0), torch.tensor([0]), cache)
    b = model.forward_cached(seq[8:].unsqueeze(0), torch.tensor([1]), cache)
    assert torch.equal(a, b) and cache.lengths.tolist() == [10, 10]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), kv_heads=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 2, 3]), keys=st.integers(1, 12), seed=st.integers(0, 99))
def test_one_query_attention_equals_sdpa(rows, kv_heads, group, keys, seed):
    """The engine's decode attention (one query per row, grouped matmuls on a CPU) gives
    SDPA's output, a row that may attend to no key included (zeros, as SDPA gives)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, kv_heads * group, 1, 8, generator=g)
    k, v = (torch.randn(rows, kv_heads, keys, 8, generator=g) for _ in range(2))
    mask = torch.rand(rows, 1, 1, keys, generator=g) > 0.4
    mask[0] = False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=group > 1)
    torch.testing.assert_close(masked_attention(q, k, v, mask), expected, atol=1e-6, rtol=0)
    assert not masked_attention(q, k, v, mask)[0].any()


def test_a_low_precision_model_on_a_cpu_caches_in_float32():
    assert cache_dtype(torch.bfloat16, "cpu") == torch.float32
    assert cache_dtype(torch.float16, torch.device("cpu")) == torch.float32
    assert cache_dtype(torch.float32, "cpu") == torch.float32
    assert cache_dtype(torch.bfloat16, "cuda") == torch.bfloat16


@torch.no_grad()
def test_bf16_decoding_from_a_float32_cache_follows_the_full_forward(model):
    """A bf16 model's cache is float32 on a CPU; decoding from it gives the uncached
    bf16 forward's logits to bf16 rounding, and the engine sizes its cache by it."""
    low = copy.deepcopy(model).to(torch.bfloat16)
    seq = tokens(16, 4)
    full = low(seq.unsqueeze(0))[0].float()
    cache = low.new_kv_cache(num_slots=2, max_len=32)
    assert cache.dtype == torch.float32 and cache.keys[0].dtype == torch.float32
    slot = torch.tensor([1])
    out = [low.forward_cached(seq[:6].unsqueeze(0), slot, cache)[0]]
    for t in range(6, 16):
        out.append(low.forward_cached(seq[t : t + 1].unsqueeze(0), slot, cache)[0])
    cached = torch.cat(out).float()
    held = cache.keys[0][1, :, :16]  # bf16 projections, widened without rounding
    assert held.abs().sum() > 0 and torch.equal(held, held.bfloat16().float())
    scale = full.abs().max()
    assert (cached - full).abs().max() < 0.05 * scale
    assert torch.equal(cached.argmax(-1), full.argmax(-1))
    engine = TorchEngine(low, max_batch_size=2, max_len=32)
    asyncio.run(engine.generate(seq[:6].tolist(), SamplingParams(temperature=0.0, max_tokens=4)))
    assert engine._cache.nbytes() == engine.kv_cache_bytes()

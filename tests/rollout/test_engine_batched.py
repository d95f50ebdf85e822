"""The engine's batched decode: sampling all rows at once, prefix reuse, a cache sized to
the requests."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.engines.interface import SamplingParams
from agentrl.engines.sampling import sample_rows, scaled_logprobs, top_p_mask
from agentrl.engines.slot_table import MIN_SHARED_PREFIX, SlotTable, common_prefix
from agentrl.engines.torch_engine import TorchEngine


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """Reference: the first token whose cumulative mass passes u × total, by a loop."""
    total, acc = float(probs.sum()), 0.0
    for token, p in enumerate(probs.tolist()):
        acc += p
        if acc > u * total:
            return token
    return len(probs) - 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]))
def test_sample_rows_matches_one_row_at_a_time(seed, temperature, top_p):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 50, generator=gen) * 3
    uniform = torch.rand(5, generator=gen)
    temps = torch.tensor([temperature, 0.0, temperature, 1.0, temperature])
    tops = torch.tensor([top_p, 1.0, 1.0, top_p, top_p])
    tokens, logprobs = sample_rows(logits, temps, tops, uniform)
    for i in range(5):
        t = float(temps[i])
        if t == 0:
            assert int(tokens[i]) == int(logits[i].argmax())
        else:
            probs = top_p_mask(torch.softmax(logits[i] / t, dim=-1), float(tops[i]))
            assert probs[tokens[i]] > 0  # never a token outside the nucleus
            assert int(tokens[i]) == inverse_cdf(probs, float(uniform[i]))
        expected = scaled_logprobs(logits[i], t)[tokens[i]]
        assert torch.allclose(logprobs[i], expected, atol=1e-5)


def test_sampled_frequencies_follow_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(20_000, 4)
    uniform = torch.rand(20_000, generator=torch.Generator().manual_seed(0))
    tokens, _ = sample_rows(logits, torch.ones(20_000), torch.ones(20_000), uniform)
    freq = torch.bincount(tokens, minlength=4).float() / 20_000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)


def generate_all(engine, prompts, params, keys=None):
    async def together():
        return await asyncio.gather(*(
            engine.generate(p, params, key=None if keys is None else keys[i])
            for i, p in enumerate(prompts)))
    return asyncio.run(together())


def test_a_group_of_identical_prompts_prefills_once(tiny_model):
    prompt = [5, 9, 40, 41, 42, 43]
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=s) for s in range(6)]
    one_slot = TorchEngine(tiny_model, max_batch_size=1, max_len=64)
    alone = [asyncio.run(one_slot.generate(prompt, p)) for p in params]  # copies its own slot
    assert one_slot.num_forwards == 1 + 6 * 7  # one prefill, then decode steps only
    engine = TorchEngine(tiny_model, max_batch_size=6, max_len=64)

    async def group():
        return await asyncio.gather(*(engine.generate(prompt, p) for p in params))

    grouped = asyncio.run(group())
    assert [g.token_ids for g in grouped] == [g.token_ids for g in alone]
    for g, a in zip(grouped, alone, strict=True):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-5)
    # one prefill forward for the six prompts, then at most 8 decode steps
    assert engine.num_forwards <= 1 + 8


def prefilled_tokens(engine) -> list[int]:
    """Spy on ``engine``'s model: the real tokens each prefill forward computes."""
    counts, forward = [], engine.model.forward_cached

    def counting(ids, slots, cache, *args, **kwargs):
        if ids.shape[1] > 1:  # a prefill (a decode step feeds one token a row)
            counts.append(int(kwargs["num_new"].sum()))
        return forward(ids, slots, cache, *args, **kwargs)

    engine.model.forward_cached = counting
    return counts


HEAD = list(range(5, 25))  # a system prompt: 20 tokens every task starts with


@pytest.mark.parametrize("together", [True, False])
def test_prompts_that_start_alike_compute_their_shared_head_once(tiny_model, together):
    prompts = [HEAD + [30 + i, 40 + i, 50] for i in range(3)]
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    engine = TorchEngine(copy.deepcopy(tiny_model), max_batch_size=3, max_len=64)
    counts = prefilled_tokens(engine)
    if together:  # one admission round: the first prompt's forward, then the others' tails
        shared = generate_all(engine, prompts, greedy)
    else:  # one after the other: each copies the head from the slot of the one before
        shared = [asyncio.run(engine.generate(p, greedy)) for p in prompts]
    assert sum(counts) == len(prompts[0]) + 2 * 3
    for prompt, got in zip(prompts, shared, strict=True):
        alone = asyncio.run(TorchEngine(tiny_model, max_batch_size=1, max_len=64).generate(
            prompt, greedy))
        assert got.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(alone.logprobs),
                              atol=1e-5)


def test_a_lone_slot_holding_the_shared_head_is_continued_by_the_next_prompt(tiny_model):
    # one slot: the prompt that shares its head must take over the slot holding it
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    engine = TorchEngine(copy.deepcopy(tiny_model), max_batch_size=1, max_len=64)
    counts = prefilled_tokens(engine)
    first, second = HEAD + [30, 40], HEAD + [31, 41, 51]
    asyncio.run(engine.generate(first, greedy))
    got = asyncio.run(engine.generate(second, greedy))
    assert counts == [len(first), 3]
    alone = asyncio.run(TorchEngine(tiny_model, max_batch_size=1, max_len=64).generate(
        second, greedy))
    assert got.token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(alone.logprobs), atol=1e-5)


def test_a_short_shared_head_or_a_batch_invariant_engine_prefills_whole(tiny_model):
    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    short = [HEAD[:MIN_SHARED_PREFIX - 1] + [30 + i] for i in range(2)]
    engine = TorchEngine(copy.deepcopy(tiny_model), max_batch_size=2, max_len=64)
    counts = prefilled_tokens(engine)
    generate_all(engine, short, greedy)
    assert sum(counts) == 2 * MIN_SHARED_PREFIX
    invariant = TorchEngine(copy.deepcopy(tiny_model), max_batch_size=2, max_len=64,
                            batch_invariant=True)
    counts = prefilled_tokens(invariant)
    generate_all(invariant, [HEAD + [30], HEAD + [31]], greedy)
    assert counts == [len(HEAD) + 1] * 2


def test_a_shared_head_comes_from_the_longest_match_under_the_same_weights():
    table = SlotTable(4, torch.device("cpu"))
    head = tuple(HEAD)
    for slot, prompt, version in [(0, head + (1, 2), 0), (1, head + (1, 3, 4), 0),
                                  (2, head + (1, 3, 4, 5), 1)]:
        table.claim(slot)
        table.remember_prompt(slot, list(prompt), torch.zeros(3), version)
    assert table.shared_prompt(head + (1, 3, 4, 9), 0) == (1, 23)  # slot 2 is version 1
    assert table.shared_prompt(head + (1, 3, 4, 9), 1) == (2, 23)
    assert table.shared_prompt(head + (1, 3, 4), 0) == (1, 22)  # one token left to compute
    assert table.shared_prompt(head + (7,), 0) == (0, 20)  # ties: the first held prompt
    assert table.shared_prompt(head[:MIN_SHARED_PREFIX - 1] + (9, 9), 0) is None
    assert table.shared_prompt(head, 2) is None  # nothing under version 2


@given(a=st.lists(st.integers(0, 3), max_size=12), b=st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_is_the_first_position_where_they_differ(a, b):
    pairs = enumerate(zip(a, b, strict=False))  # up to the shorter one
    expected = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
    assert common_prefix(a, b) == expected == common_prefix(tuple(a), b)


def test_the_next_turn_of_a_rollout_prefills_only_its_new_tokens(tiny_model):
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    engine = TorchEngine(tiny_model, max_batch_size=2, max_len=64)
    first = asyncio.run(engine.generate([5, 9, 40, 41], greedy, key="rollout-1"))
    turn2 = [5, 9, 40, 41, *first.token_ids, 300, 301, 302]
    cache = engine._cache
    reused = asyncio.run(engine.generate(turn2, greedy, key="rollout-1"))
    fresh = asyncio.run(TorchEngine(tiny_model, max_batch_size=2, max_len=64).generate(
        turn2, greedy))
    assert reused.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(reused.logprobs), torch.tensor(fresh.logprobs),
                          atol=1e-5)
    assert engine._cache is cache  # the same slot, continued: no new cache


def test_a_keys_next_prompt_continues_the_slot_it_extends_most():
    # several idle slots of one key, all sharing the chat template's first tokens: the
    # next prompt continues the slot it shares most with
    table = SlotTable(3, torch.device("cpu"))
    for slot, held in [(0, [1, 2, 3, 4]), (1, [1, 2, 7, 8, 9, 10]), (2, [1, 2, 7, 8, 9])]:
        table.claim(slot)
        table.cached_under[slot] = 0  # its keys/values came from weights version 0
        table.release(slot, "rollout-1", held)
    assert table.continuation_of("rollout-1", [1, 2, 7, 8, 9, 10, 11], 0) == (1, 6)
    assert table.continuation_of("rollout-1", [1, 2, 3, 9], 0) == (0, 3)
    assert table.continuation_of("rollout-2", [1, 2, 3, 9], 0) is None  # another rollout's
    assert table.continuation_of("rollout-1", [1, 2, 7], 0) == (1, 2)  # one token left to run
    assert table.continuation_of("rollout-1", [1, 2, 3, 9], 1) is None  # other weights


def test_new_weights_forget_cached_prefixes(tiny_model, tiny_ckpt):
    engine = TorchEngine(tiny_model, max_batch_size=2, max_len=64)
    asyncio.run(engine.generate([5, 9, 40], SamplingParams(temperature=0.0, max_tokens=3),
                                key="r"))
    assert engine._table.prompt_slot and engine._table.idle
    engine.update_weights(list(tiny_model.named_parameters()))
    assert not engine._table.prompt_slot and not engine._table.idle


def test_the_cache_is_sized_to_the_requests_not_the_model(tiny_model):
    engine = TorchEngine(tiny_model, max_batch_size=8, max_len=4096)
    generate_all(engine, [[1, 2, 3]] * 8, SamplingParams(temperature=1.0, max_tokens=10))
    assert engine._cache.capacity == 64  # one growth block holds prompt + 10 tokens
    assert engine._cache.nbytes() * 64 == engine.kv_cache_bytes()


def test_sparse_running_requests_move_down_and_keep_their_tokens(tiny_model):
    prompts = [[7 + i, 8, 9] for i in range(12)]
    lengths = [2] * 11 + [20]  # eleven end early: the last one moves to slot 0
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
    engine = TorchEngine(tiny_model, max_batch_size=12, max_len=64)

    async def together():
        return await asyncio.gather(*(engine.generate(p, q) for p, q in
                                      zip(prompts, params, strict=True)))

    got = asyncio.run(together())
    alone = asyncio.run(TorchEngine(tiny_model, max_batch_size=1, max_len=64).generate(
        prompts[-1], params[-1]))
    assert got[-1].token_ids == alone.token_ids
    assert [len(g.token_ids) for g in got] == lengths

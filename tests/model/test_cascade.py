"""Batched decode reading a group's shared prompt once (agentrl.model.cascade): the same
attention as reading every slot in full, the cache's record of which slots hold copies,
and the engine's generations with it on and off."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import cascade, load_pretrained
from agentrl.model.attention import masked_attention
from agentrl.model.cascade import cascade_attention, plan_prefixes
from agentrl.model.kv_cache import KVCache

CPU = torch.device("cpu")


@st.composite
def decode_batches(draw):
    """Rows of a batched decode over slots that hold true copies of their group's first
    positions: (q, k, v, mask, plan inputs, running)."""
    rows = draw(st.integers(2, 12))
    kv_heads, per_kv, dim = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), 8
    num_slots = rows + draw(st.integers(0, 4))
    slots = draw(st.permutations(range(num_slots)))[:rows]
    group_of = [-1] * num_slots
    shared = [0] * num_slots
    for slot in slots:
        group_of[slot] = draw(st.sampled_from([-1, 0, 0, 1, 1, 2]))
        shared[slot] = draw(st.integers(1, 9)) if group_of[slot] >= 0 else 0
    if draw(st.booleans()):  # groups in consecutive rows, as the engine admits them
        slots = sorted(slots, key=lambda slot: group_of[slot])
    lengths = [shared[s] + draw(st.integers(0, 6)) for s in slots]  # cached before the token
    running = [draw(st.sampled_from([True, True, True, False])) for _ in slots]
    seed = draw(st.integers(0, 10_000))
    span = max(lengths) + 1
    g = torch.Generator().manual_seed(seed)
    roots = torch.randn(3, 2, kv_heads, span, dim, generator=g)  # per group: keys, values
    k, v = (torch.randn(rows, kv_heads, span, dim, generator=g) for _ in range(2))
    for row, slot in enumerate(slots):
        if group_of[slot] >= 0:  # its first positions: a copy of its group's
            k[row, :, :shared[slot]] = roots[group_of[slot], 0, :, :shared[slot]]
            v[row, :, :shared[slot]] = roots[group_of[slot], 1, :, :shared[slot]]
    q = torch.randn(rows, kv_heads * per_kv, 1, dim, generator=g)
    mask = (torch.arange(span) <= torch.tensor(lengths)[:, None]).reshape(rows, 1, 1, span)
    return q, k, v, mask, (slots, running, group_of, shared), running


@settings(max_examples=150, deadline=None)
@given(batch=decode_batches())
def test_reading_shared_positions_once_is_the_same_attention(batch):
    q, k, v, mask, plan_inputs, running = batch
    plan = plan_prefixes(*plan_inputs, CPU, position_bytes=1, min_saved=1)
    assume(plan is not None)
    got = cascade_attention(q, k, v, mask, plan)
    expected = masked_attention(q, k, v, mask)
    rows = torch.tensor(running)
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-5, rtol=0)


def test_the_shared_positions_really_come_from_the_source_row():
    """Members' own copies of the shared positions are not read: spoiling them changes
    nothing, spoiling the source's changes every member."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(4, 2, 6, 8, generator=g), torch.randn(4, 2, 6, 8, generator=g)
    k[1:, :, :4], v[1:, :, :4] = k[:1, :, :4], v[:1, :, :4]
    q = torch.randn(4, 2, 1, 8, generator=g)
    mask = torch.ones(4, 1, 1, 6, dtype=torch.bool)
    plan = plan_prefixes([0, 1, 2, 3], [True] * 4, [0] * 4, [4] * 4, CPU, 1, min_saved=1)
    assert plan is not None and plan.length == 4 and plan.in_order
    before = cascade_attention(q, k, v, mask, plan)
    torch.testing.assert_close(before, masked_attention(q, k, v, mask), atol=1e-6, rtol=0)
    spoiled = k.clone()
    spoiled[1:, :, :4] = 0
    assert torch.equal(cascade_attention(q, spoiled, v, mask, plan), before)
    spoiled = k.clone()
    spoiled[0, :, :4] = 0
    assert not torch.isclose(cascade_attention(q, spoiled, v, mask, plan), before).any()


def test_a_plan_only_where_it_reads_less():
    def plan(slots, running, group_of, shared, position_bytes=1 << 20):
        return plan_prefixes(slots, running, group_of, shared, CPU, position_bytes)

    assert plan([0, 1, 2, 3], [True] * 4, [-1] * 4, [0] * 4) is None  # nothing shared
    pairs = [0, 0, 1, 1]
    # two rows skip reading 4 shared positions of 1 MiB each: 8 MiB, just enough
    got = plan([0, 1, 2, 3], [True] * 4, pairs, [4, 5, 6, 6])
    assert got is not None and got.length == 4 and got.in_order
    assert plan([0, 1, 2, 3], [True] * 4, pairs, [3, 5, 6, 6]) is None  # 6 MiB
    assert plan([0, 1, 2, 3], [True] * 4, pairs, [4, 5, 6, 6], 1 << 19) is None
    # one pair and three rows on their own: 4 groups read for 5 rows
    assert plan(list(range(5)), [True] * 5, [0, 0, -1, -1, -1], [40] * 5) is None
    # a finished row, and groups of unequal size: rows are gathered, not reshaped
    got = plan([3, 1, 0, 2, 4], [True, False, True, True, True], [7, 7, 7, 7, 5], [40] * 5)
    assert got is not None and not got.in_order
    assert got.members.tolist() == [[0, 2, 3], [4, 4, 4]] and got.sources.tolist() == [0, 4]
    assert got.place.tolist() == [0, 0, 1, 2, 3]


def test_finished_rows_keep_consecutive_groups_reshaped():
    """A row that decodes nothing sits in its group (its output is unused), so groups in
    consecutive rows stay reshaped after some rows finish; a finished row may lead its
    group only while its slot still holds the group's copy."""
    def plan(running, group_of):
        return plan_prefixes(list(range(8)), running, group_of, [4] * 8, CPU, 1, min_saved=1)

    running = [True, True, False, True, False, True, True, True]
    got = plan(running, [0, 0, 0, 0, 1, 1, 1, 1])
    assert got is not None and got.in_order and got.sources.tolist() == [0, 4]
    assert got.place.tolist() == list(range(8))
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(8, 2, 6, 8, generator=g), torch.randn(8, 2, 6, 8, generator=g)
    for first in (0, 4):  # every slot of a group holds its copy, finished or not
        k[first + 1:first + 4, :, :4], v[first + 1:first + 4, :, :4] = (
            k[first:first + 1, :, :4], v[first:first + 1, :, :4])
    q, mask = torch.randn(8, 2, 1, 8, generator=g), torch.ones(8, 1, 1, 6, dtype=torch.bool)
    rows = torch.tensor(running)
    torch.testing.assert_close(cascade_attention(q, k, v, mask, got)[rows],
                               masked_attention(q, k, v, mask)[rows], atol=1e-6, rtol=0)
    # row 4's slot no longer holds the copy: it cannot lead, so the rows are gathered
    got = plan(running, [0, 0, 0, 0, -1, 1, 1, 1])
    assert got is not None and not got.in_order and got.sources.tolist() == [0, 5]


def test_a_lone_running_row_reads_its_own_positions_beside_idle_ones():
    """Hypothesis found this: rows 0-2 share 2 positions; row 4, running alone in group
    1, shares only 1 with idle rows 3 (which holds 2) and 5. Seating row 3 first must not
    make row 4 read row 3's second position."""
    running = [True, True, True, False, True, False]
    group_of, shared = [0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 1, 1]
    got = plan_prefixes(list(range(6)), running, group_of, shared, CPU, 1, min_saved=1)
    assert got is not None and got.length == 2
    assert 4 in got.sources.tolist() and 3 not in got.sources.tolist()
    g = torch.Generator().manual_seed(2)
    roots = torch.randn(2, 2, 1, 2, 8, generator=g)  # per group: keys, values
    k, v = torch.randn(6, 1, 4, 8, generator=g), torch.randn(6, 1, 4, 8, generator=g)
    for row in range(6):
        root, n = roots[group_of[row]], shared[row]
        k[row, :, :n], v[row, :, :n] = root[0, :, :n], root[1, :, :n]
    q, mask = torch.randn(6, 2, 1, 8, generator=g), torch.ones(6, 1, 1, 4, dtype=torch.bool)
    rows = torch.tensor(running)
    torch.testing.assert_close(cascade_attention(q, k, v, mask, got)[rows],
                               masked_attention(q, k, v, mask)[rows], atol=1e-6, rtol=0)


def test_a_group_twice_the_size_reads_in_runs_of_the_others():
    """Two groups of one prompt make one cache group of 16 rows, not all consecutive,
    beside a group of 8: cut into runs of 8, each reading its own first row's copy, the
    rows stay reshaped."""
    group_of = [0] * 8 + [1] * 8 + [0] * 8
    got = plan_prefixes(list(range(24)), [True] * 24, group_of, [4] * 24, CPU, 1,
                        min_saved=1)
    assert got is not None and got.in_order and got.sources.tolist() == [0, 8, 16]
    g = torch.Generator().manual_seed(1)
    roots = torch.randn(2, 2, 2, 4, 8, generator=g)  # per group: keys, values
    k, v = torch.randn(24, 2, 6, 8, generator=g), torch.randn(24, 2, 6, 8, generator=g)
    for row, group in enumerate(group_of):
        k[row, :, :4], v[row, :, :4] = roots[group]
    q, mask = torch.randn(24, 2, 1, 8, generator=g), torch.ones(24, 1, 1, 6, dtype=torch.bool)
    torch.testing.assert_close(cascade_attention(q, k, v, mask, got),
                               masked_attention(q, k, v, mask), atol=1e-6, rtol=0)


def test_the_cache_records_which_slots_hold_copies():
    cache = KVCache(1, num_slots=5, max_len=64, num_kv_heads=1, head_dim=4,
                    dtype=torch.float32)
    cache.lengths[0] = 30
    cache.copy_prefix(0, 1, 30)
    cache.copy_prefix(1, 2, 20)  # a copy of part of a copy
    assert cache.prefix_group[:3] == [0, 0, 0] and cache.prefix_len[:3] == [30, 30, 20]
    cache.set_length(1, 12)  # continued from its first 12 positions: later ones change
    assert cache.prefix_len[1] == 12 and cache.prefix_group[1] == 0
    cache.reset(2)
    assert cache.prefix_group[2] == -1 and cache.prefix_len[2] == 0
    cache.lengths[3] = 25
    cache.copy_prefix(3, 4, 25)  # another prompt: another group
    assert cache.prefix_group[3:] == [1, 1]
    cache.copy_prefix(0, 0, 10)  # a slot cut back in place
    assert cache.prefix_len[0] == 10 and int(cache.lengths[0]) == 10


@pytest.fixture(scope="module")
def model(tiny_qwen2):
    return load_pretrained(tiny_qwen2, attention="torch").eval()


@pytest.fixture
def plans(monkeypatch):
    """The plans shared-prompt decoding runs with (the tiny model's copies are small, so
    it runs whatever it saves)."""
    seen: list = []
    attend = cascade.cascade_attention

    def recorded(q, k, v, mask, plan):
        seen.append((q.shape[0], plan))
        return attend(q, k, v, mask, plan)

    monkeypatch.setattr("agentrl.model.layers.cascade_attention", recorded)
    monkeypatch.setattr("agentrl.model.cascade.MIN_SAVED_BYTES", 1)
    return seen


def generate_both_ways(model, requests: list, plans: list) -> list:
    """The engine's generations without and with shared-prompt decoding, checked equal
    (greedy tokens, log-probs to 1e-5), the first with no plan run; returns the second."""

    def generate(share: bool) -> list:
        engine = TorchEngine(model, max_batch_size=len(requests), max_len=128)
        engine.share_prefixes = share

        async def together():
            return await asyncio.gather(*(engine.generate(p, s) for p, s in requests))

        return asyncio.run(together())

    plain = generate(False)
    assert not plans
    shared = generate(True)
    for a, b in zip(shared, plain, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)
    return shared


@pytest.mark.parametrize("interleaved", [False, True])
def test_engine_generations_are_the_same_with_and_without_it(model, plans, interleaved):
    """Groups of one long prompt decode together; requests end at different lengths, so
    groups shrink. Requests of a group arriving together take consecutive slots and stay
    reshaped as their rows finish; groups arriving interleaved are gathered."""
    prompts = [list(range(10 + g, 50 + g)) for g in range(3)]
    requests = [(prompts[i % 3 if interleaved else i // 4],
                 SamplingParams(temperature=0.0, max_tokens=4 + 3 * (i % 4)))
                for i in range(12)]
    generate_both_ways(model, requests, plans)
    assert {plan.in_order for _, plan in plans} == {not interleaved}


def test_groups_survive_running_requests_moving_down(model, plans):
    """Most requests end after 2 tokens; the rest move down into the freed slots (their
    cache copied there) and still decode with their groups' prompts read once."""
    prompts = [list(range(10, 50)), list(range(60, 100))]
    short = {0, 1, 2, 3, 4, 5, 8, 9, 10}
    requests = [(prompts[i // 8], SamplingParams(temperature=0.0,
                                                 max_tokens=2 if i in short else 12))
                for i in range(16)]
    generate_both_ways(model, requests, plans)
    rows = [n for n, _ in plans]
    assert max(rows) == 16 and min(rows) <= 8  # decoded after moving down


def test_a_batch_invariant_engine_never_shares():
    engine = TorchEngine(torch.nn.Linear(1, 1), batch_invariant=True)
    assert not engine.share_prefixes

"""Copy pretraining: the task's rows, and that it trains a tiny model to copy."""

from __future__ import annotations

import math
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.train.copy_pretrain import (
    KEYED_SEPARATORS,
    copy_pretrain,
    copy_rows,
    keyed_rows,
    keyed_separators,
)


def test_rows_repeat_a_span_after_a_gap_with_the_loss_on_the_repeat():
    for row in copy_rows(random.Random(0), 50, batch_size=20):
        n = sum(row.loss_mask)
        assert 4 <= n <= 24 and row.loss_mask[-n:] == [1] * n
        assert row.token_ids[:n] == row.token_ids[-n:]
        assert all(0 <= t < 50 for t in row.token_ids)
        assert len(row.token_ids) == len(row.loss_mask) == len(row.logprobs)


def test_a_tiny_model_learns_to_copy(tmp_path):
    """The loss on the repeat falls well below ln(ids drawn from): below what knowing
    only which ids occur can reach, so the model reads the earlier span (a small
    problem: 40 ids, spans up to 8 after gaps up to 12)."""
    folder = build_tiny_checkpoint(tmp_path / "tiny", hidden_size=64, num_layers=2,
                                   num_heads=2, num_kv_heads=1, vocab_size=300, seed=0)
    model = load_pretrained(folder)
    torch.manual_seed(0)
    before = [p.detach().clone() for p in model.parameters()]
    losses: list[str] = []
    last = copy_pretrain(model, 40, num_steps=600, lr=3e-3, log=losses.append, max_span=8,
                         max_gap=12)
    assert float(losses[0].split("loss ")[1].split()[0]) > 5.0  # ~ln(300) at the start
    assert last < math.log(40) - 0.7, losses  # ln 40 = 3.69: the unigram floor
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), separators=st.sampled_from([(1,), (1, 2), (2,), (1, 2, 3)]))
def test_keyed_rows_ask_every_key_for_the_value_its_line_gave(seed, separators):
    """After the lines, every key comes back once with the row's separator, trained on
    the value that followed that key and separator in its line: a lookup by key, which
    copying the previous token's successor cannot do, since the separator repeats on
    every line."""
    for row in keyed_rows(random.Random(seed), 50, batch_size=4, separators=separators):
        ids, mask = row.token_ids, row.loss_mask
        assert len(ids) == len(mask) == len(row.logprobs) and all(0 <= t < 50 for t in ids)
        trained = [i for i, m in enumerate(mask) if m]
        length = trained[1] - trained[0] - 2  # queries are key, separator, value
        assert length in separators and trained[-1] == len(ids) - 1
        lines = ids[:trained[0] - length - 1]
        separator = ids[trained[0] - length:trained[0]]
        keys = []
        for i in trained:
            assert ids[i - length:i] == separator
            key = ids[i - length - 1]
            keys.append(key)
            found = [j + length + 1 for j in range(len(lines) - length - 1)
                     if lines[j] == key and lines[j + 1:j + length + 1] == separator]
            assert ids[i] in [lines[f] for f in found]  # its line (filler may echo it)
        assert len(set(keys)) == len(keys) >= 2


def test_keyed_separators_grow_by_quarters():
    """One-token separators first, then up to two, then all: the order in which the
    lengths can be learned (module docstring)."""
    got = [keyed_separators(step, 8) for step in range(8)]
    assert got == [(1,), (1,), (1, 2), (1, 2), *[KEYED_SEPARATORS] * 4]

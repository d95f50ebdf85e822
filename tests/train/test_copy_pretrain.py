"""Copy pretraining: the task's rows, and that it trains a tiny model to copy."""

from __future__ import annotations

import math
import random

import torch

from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.train.copy_pretrain import copy_pretrain, copy_rows


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

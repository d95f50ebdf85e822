"""Copy pretraining: the task's rows, and that it trains a tiny model to copy."""

from __future__ import annotations

import random

import torch

from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.train.copy_pretrain import copy_pretrain, copy_rows


def test_rows_repeat_a_span_after_a_gap_with_the_loss_on_the_repeat():
    for row in copy_rows(random.Random(0), 50, batch_size=20):
        n = sum(row.loss_mask)
        assert 4 <= n <= 24 and row.loss_mask[-n:] == [1] * n
        assert row.token_ids[:n] == row.token_ids[-n:]
        assert all(0 <= t < 50 for t in row.token_ids)
        assert len(row.token_ids) == len(row.loss_mask) == len(row.logprobs)


def test_a_tiny_model_learns_to_copy(tmp_path):
    """The loss on the repeat falls from ln(vocabulary) once the circuit forms."""
    folder = build_tiny_checkpoint(tmp_path / "tiny", hidden_size=64, num_layers=2,
                                   num_heads=2, num_kv_heads=1, vocab_size=300, seed=0)
    model = load_pretrained(folder)
    num_tokens = load_tokenizer(folder).raw.get_vocab_size(with_added_tokens=False)
    torch.manual_seed(0)
    before = [p.detach().clone() for p in model.parameters()]
    losses: list[str] = []
    last = copy_pretrain(model, num_tokens, num_steps=1500, lr=2e-3, log=losses.append)
    assert float(losses[0].split("loss ")[1].split()[0]) > 5.0  # ~ln(293) at the start
    assert last < 2.0, losses
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

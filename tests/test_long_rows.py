"""Long rows are a first-class case: one 32,768-token packed micro-batch gives the gradient
of the same rows split into micro-batches by a budget.

The packed side runs as the GPU trainer does (activation checkpointing, log-probs in
chunks); the split side runs plain. Tiny model, so it stays a unit test (a few seconds).
"""

from __future__ import annotations

import random

import torch
from test_update import ARGS, CFG, COST, VOCAB, gradient, make_model

from agentrl.packing import collate, plan_micro_batches
from agentrl.types import Row

LENGTHS = [4096] + [2048] * 6 + [1024] * 8 + [512] * 16  # 32,768 tokens in 31 rows


def _rows() -> tuple[list[Row], list[float]]:
    rng = random.Random(7)
    rows, advantages = [], []
    for k, length in enumerate(LENGTHS):
        mask = [0] * 50 + [rng.random() < 0.8 for _ in range(length - 50)]  # prompt, turns
        rows.append(Row(f"r{k}", "g", "e", 0, [rng.randrange(VOCAB) for _ in mask],
                        [int(m) for m in mask], [-rng.uniform(0.5, 3.0) * m for m in mask],
                        reward=float(k % 2)))
        advantages.append(rng.uniform(-1.0, 1.0))
    return rows, advantages


def test_one_32k_packed_row_equals_the_rows_split_by_budget() -> None:
    assert sum(LENGTHS) == 32768 and ARGS.max_position_embeddings >= max(LENGTHS)
    rows, advantages = _rows()
    model = make_model()
    packed = [collate(rows, advantages, range(len(rows)))]
    assert packed[0].input_ids.shape == (1, 32768 - len(LENGTHS))  # no row's last token
    model.configure_memory(activation_checkpointing=True, logprob_chunk_tokens=4096)
    one = gradient(model, packed, CFG)

    plan = plan_micro_batches(LENGTHS, 8192, 1, COST)[0]
    assert len(plan) >= 2  # the budget really splits them
    split = [collate(rows, advantages, mb) for mb in plan]
    model.configure_memory(activation_checkpointing=False)
    many = gradient(model, split, CFG)
    assert one.abs().max() > 1e-4  # not a comparison of zeros
    torch.testing.assert_close(one, many, atol=1e-6, rtol=1e-5)

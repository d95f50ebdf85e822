"""Warm start: scripted demonstrations are correct episodes with the runner's token layout,
and a supervised step lowers their loss."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from agentrl.config import config_from_dict
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.reassembler import to_rows
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.train.sft import sft_lr, sft_step
from environments._verify import parse_arithmetic
from environments.calculator import calculator_expression
from environments.countdown import countdown_solution


def test_calculator_expression_follows_the_story() -> None:
    story = ("Ana has 16 coins. Then they share them equally with a group of 2, keeping one "
             "share. Then they get 5 more coins. How many coins does Ana have now?")
    assert calculator_expression(story) == "(16 / 2) + 5"


@pytest.mark.parametrize(("numbers", "target"), [([5, 5], 1), ([3, 4, 5], 17), ([6, 2], 3)])
def test_countdown_solution_uses_each_number_once(numbers, target) -> None:
    expression = countdown_solution(numbers, target)
    value, literals = parse_arithmetic(expression)
    assert value == target and sorted(literals) == sorted(Fraction(n) for n in numbers)


def test_demonstrations_solve_tasks_and_sft_learns_them(tmp_path) -> None:
    config = config_from_dict({
        "environments": [
            {"id": "agentrl/Calculator-v0", "kwargs": {"num_operations": 2}},
            {"id": "agentrl/Countdown-v0", "kwargs": {"num_numbers": 2, "max_number": 9}},
        ],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 1, "global_batch_size": 2},
    })
    path = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                                 num_kv_heads=1, vocab_size=300)
    tokenizer = load_tokenizer(path)
    rollouts = asyncio.run(play_demonstrations(config, tokenizer, 8, seed=0))
    assert len(rollouts) == 8  # every scripted episode was graded correct
    calculator = [r for r in rollouts if r.env == "Calculator-v0"]
    # one tool call with the whole expression, then the answer
    assert calculator and all(r.stats.num_turns == 2 for r in calculator)
    assert all(r.reward_components["used_calculator"] == 1.0 for r in calculator)
    rows = to_rows(rollouts)
    model = load_pretrained(path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = sft_step(model, rows, optimizer, 4096)
    for _ in range(5):
        last = sft_step(model, rows, optimizer, 4096)
    assert last < first * 0.8


def test_sft_lr_warms_up_then_decays_to_zero() -> None:
    # 5 warm-up steps ramp 1/6 .. 5/6 of the peak; then cosine from the peak to 0 over
    # steps 5..15 (span 10): step 10 is halfway, cos(pi/2) = 0 -> half the peak
    lrs = [sft_lr(s, 16, 1.0, 5) for s in range(16)]
    assert lrs[:5] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6])
    assert lrs[5] == pytest.approx(1.0) and lrs[10] == pytest.approx(0.5)
    assert lrs[15] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:], strict=False))
    # linear: straight line from the peak at step 5 to 0 at step 15
    assert sft_lr(8, 16, 2.0, 5, "linear") == pytest.approx(2.0 * (1 - 3 / 10))
    assert sft_lr(15, 16, 2.0, 5, "constant") == 2.0
    with pytest.raises(ValueError, match="lr schedule 'step'"):
        sft_lr(0, 16, 1.0, 5, "step")


def test_sft_step_runs_the_head_at_generated_tokens_only_with_the_plain_loss(tmp_path):
    """The step takes the RL update's fast path (the LM head only at the generated tokens)
    and its loss and gradient are those of the plain full-logits cross-entropy."""
    import random

    from agentrl.packing import collate
    from agentrl.train.copy_pretrain import copy_rows

    path = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=2, num_heads=2,
                                 num_kv_heads=1, vocab_size=300)
    rows = copy_rows(random.Random(0), 200, batch_size=6)
    model = load_pretrained(path)
    mb = collate(rows, [1.0] * len(rows), list(range(len(rows))))
    logits = model(mb.input_ids, mb.position_ids, mb.cu_seqlens)  # [1, T, V], the reference
    picked = logits.log_softmax(-1).gather(-1, mb.target_ids[..., None])[..., 0]
    reference = -(picked * mb.loss_mask).sum() / mb.loss_mask.sum()
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    head_rows = []
    model.lm_head.register_forward_pre_hook(lambda _, args: head_rows.append(args[0].numel() // 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step leaves the weights
    loss = sft_step(model, rows, optimizer, 120)  # several micro-batches
    assert loss == pytest.approx(reference.item(), rel=1e-5)
    assert sum(head_rows) == sum(sum(r.loss_mask) for r in rows)  # never the prompt's
    scale = min(1.0, 1.0 / float(torch.cat([g.reshape(-1) for g in expected]).norm()))
    for p, g in zip(model.parameters(), expected, strict=True):  # clipped to norm 1
        torch.testing.assert_close(p.grad, g * scale, rtol=1e-4, atol=1e-6)


def _trained_steps(tmp_path: Path, monkeypatch, **extra: int) -> tuple[list[list], Path]:
    """The rows of every step of a 3-step warm start of a tiny model on Countdown (2
    demonstration rows a step) with ``extra`` warm-start settings; and the base folder."""
    import agentrl.train.sft as sft
    from agentrl.train.sft import WarmStartConfig, warm_start

    config = config_from_dict({
        "environments": [{"id": "agentrl/Countdown-v0",
                          "kwargs": {"num_numbers": 2, "max_number": 9}}],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 1, "global_batch_size": 2},
    })
    base = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                                 num_kv_heads=1, vocab_size=300)
    steps: list[list] = []
    real_step = sft.sft_step
    monkeypatch.setattr(sft, "sft_step", lambda model, rows, *a: steps.append(rows) or
                        real_step(model, rows, *a))
    ws = WarmStartConfig(num_steps=3, rows_per_step=2, num_demonstrations=4, **extra)
    warm_start(config, tmp_path / "out", ws, base=str(base), log=lambda _: None)
    assert len(steps) == 3
    return steps, base


def test_recall_rows_join_every_step_beside_the_demonstrations(tmp_path, monkeypatch) -> None:
    """--recall-rows N: every SFT step trains its demonstration rows plus N recall rows,
    tokenized with the model's tokenizer and trained on their answers only."""
    steps, base = _trained_steps(tmp_path, monkeypatch, recall_rows=5)
    tokenizer = load_tokenizer(base)
    for rows in steps:
        recall = [r for r in rows if r.env == "recall"]
        assert len(recall) == 5 and len(rows) == 7
        for row in recall:
            trained = tokenizer.decode([t for t, m in zip(row.token_ids, row.loss_mask,
                                                          strict=True) if m])
            assert trained.rstrip().endswith(".") and "What" not in trained


def test_copy_rows_join_every_step_beside_the_demonstrations(tmp_path, monkeypatch) -> None:
    """--copy-rows N: every SFT step also trains N rows of the copy pretraining's task (a
    span of ordinary token ids repeated after a gap, trained on the repeat only) and N
    keyed recall rows, so that the demonstrations do not overwrite those circuits."""
    steps, base = _trained_steps(tmp_path, monkeypatch, copy_rows=4)
    ordinary = load_tokenizer(base).raw.get_vocab_size(with_added_tokens=False)
    for rows in steps:
        copies = [r for r in rows if r.env == "copy"]
        keyed = [r for r in rows if r.env == "keyed"]
        assert len(copies) == 4 and len(keyed) == 4 and len(rows) == 10
        assert all(max(r.token_ids) < ordinary and sum(r.loss_mask) >= 2 for r in keyed)
        for row in copies:
            repeat = [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]
            assert repeat and row.token_ids[:len(repeat)] == repeat
            assert row.token_ids[-len(repeat):] == repeat and max(row.token_ids) < ordinary

"""Stand-alone trainer pieces: LR warm-up, RNG capture, metric writers, report brackets."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from agentrl.commands.report import (
    describe_run,
    plot_runs,
    reward_trend,
    smoothed,
    target_bracket,
)
from agentrl.config import OptimConfig
from agentrl.config.schedule import lr_factor
from agentrl.observe.writers import JsonlWriter, read_metrics
from agentrl.train.checkpoint import TrainerState, capture_rng, list_checkpoints, restore_rng
from agentrl.train.optimizer import build_optimizer, build_scheduler
from agentrl.train.trainer import scored_mismatch
from agentrl.train.update import UpdateStats


def test_warmup_is_linear_then_constant() -> None:
    assert [lr_factor(u, 4) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 0) == 1.0


def test_scheduler_drives_optimizer_lr() -> None:
    model = torch.nn.Linear(2, 2)
    optim = OptimConfig(lr=0.1, warmup_steps=2)
    optimizer = build_optimizer(model, optim)
    scheduler = build_scheduler(optimizer, optim)
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert np.allclose(seen, [0.05, 0.1, 0.1])


def test_the_optimizer_is_fused_and_steps_like_torchs_default() -> None:
    """Fused AdamW on a CPU: the same parameters as the per-operation implementation after
    several steps (to float rounding), frozen parameters left out."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for model in models:
        model[0].bias.requires_grad_(False)
    start = [p.detach().clone() for p in models[0].parameters()]
    optim = OptimConfig(lr=0.05, weight_decay=0.1)
    fused = build_optimizer(models[0], optim)
    assert fused.param_groups[0]["fused"] is True
    assert len(fused.param_groups[0]["params"]) == 3
    plain = torch.optim.AdamW([p for p in models[1].parameters() if p.requires_grad],
                              lr=0.05, weight_decay=0.1, foreach=False)
    x = torch.randn(32, 8)
    for _ in range(5):
        for model, optimizer in zip(models, (fused, plain), strict=True):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    moved = [not torch.equal(a, b) for a, b in zip(models[0].parameters(), start, strict=True)]
    assert moved == [True, False, True, True]  # the frozen bias stays put


def test_rng_capture_survives_json_and_restores_draws() -> None:
    import msgspec

    state = TrainerState()
    random.seed(3)
    np.random.seed(4)
    capture_rng(state)
    expected = (random.random(), np.random.rand())
    decoded = msgspec.json.decode(msgspec.json.encode(state), type=TrainerState)
    random.seed(99)
    np.random.seed(99)
    restore_rng(decoded)
    assert (random.random(), np.random.rand()) == expected


def test_jsonl_resume_drops_steps_after_checkpoint(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = JsonlWriter(path)
    for step in (1, 2, 3):
        writer.write({"step": step, "reward/mean": step / 10, "bad": float("nan")})
    writer.close()
    assert json.loads(path.read_text().splitlines()[0])["bad"] is None
    writer = JsonlWriter(path, resume_step=2)  # step 3 was logged but never checkpointed
    writer.write({"step": 3, "reward/mean": 0.9})
    writer.close()
    assert [(m["step"], m["reward/mean"]) for m in read_metrics(path)] == [
        (1, 0.1), (2, 0.2), (3, 0.9)
    ]


def test_temp_checkpoint_folders_are_ignored(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    (root / "step_2").mkdir(parents=True)
    (root / "step_2" / "trainer_state.json").write_text("{}")
    (root / ".tmp-step_4-abc").mkdir()
    (root / "step_10").mkdir()  # no state file: incomplete
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]


def _records(accs: list[float | None]) -> list[dict]:
    return [
        {"step": i + 1, "cumulative/rollouts": 8 * (i + 1), "reward/mean": 0.1 * i,
         **({"eval/accuracy": a} if a is not None else {})}
        for i, a in enumerate(accs)
    ]


def test_target_bracket_is_first_hit_and_eval_before() -> None:
    records = _records([0.1, None, 0.3, None, 0.6, 0.7])
    before, after = target_bracket(records, "eval/accuracy", 0.5)
    assert (before["step"], after["step"]) == (3, 5)
    before, after = target_bracket(records, "eval/accuracy", 0.05)
    assert before is None and after["step"] == 1
    assert target_bracket(records, "eval/accuracy", 0.9)[1] is None
    assert "between step 3 (24 rollouts" in describe_run("r", records, "eval/accuracy", 0.5)


def test_the_reward_windows_never_overlap() -> None:
    """A short run is not compared with itself: each window is at most half the run."""
    assert reward_trend([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == (
        "first 3 steps 1.000 → last 3 steps 4.000")
    assert reward_trend([float(i) for i in range(25)]).startswith(
        "first 10 steps 4.500 → last 10 steps 19.500")
    assert reward_trend([0.0, 1.0, 2.0]) == "first step 0.000 → last step 2.000"
    assert "too short to compare" in reward_trend([0.391])
    assert "reward/mean, first step 0.000 → last step 0.100" in describe_run(
        "r", _records([None, None]), "eval/accuracy", None)


def test_report_writes_png(tmp_path) -> None:
    out = tmp_path / "r.png"
    plot_runs({"a": _records([0.1, 0.4]), "b": _records([0.2, 0.6])}, "eval/accuracy", 0.5, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smoothed_is_a_trailing_mean_and_per_env_lines_are_reported() -> None:
    records = [{"step": i, "reward/mean": r} for i, r in enumerate([0.0, 1.0, 2.0, 3.0])]
    assert [r["reward/mean"] for r in smoothed(records, "reward/mean", 2)] == [
        0.0, 0.5, 1.5, 2.5]
    with_envs = [{"step": 0, "eval/accuracy": 0.5, "eval/calc/accuracy": 0.25,
                  "env/calc/reward/mean": 0.1},
                 {"step": 1, "eval/accuracy": 0.75, "eval/calc/accuracy": 0.5,
                  "env/calc/reward/mean": 0.3}]
    assert "calc: 0.250 → 0.500" in describe_run("run", with_envs, "eval/accuracy", None)


def test_scored_mismatch_weighs_the_first_update_and_the_scored_rest_by_tokens() -> None:
    """The collection's mismatch before any update: the first update's own figure (its
    forward saw the pre-update weights) joined token by token with the scoring pass's."""
    first = UpdateStats(loss=0.0, policy_loss=0.0, kl_loss=0.0, clip_frac_low=0.0,
                        clip_frac_high=0.0, approx_kl=0.0, entropy=0.0, mismatch=0.5,
                        tis_weight=1.0, num_tokens=10, num_micro_batches=1)
    assert scored_mismatch(first, torch.tensor([3.0, 20.0], dtype=torch.float64)) == (
        (0.5 * 10 + 3.0) / 30)
    assert scored_mismatch(first, torch.zeros(2, dtype=torch.float64)) == 0.5  # one update


def test_a_collection_other_than_the_plan_is_refused():
    from agentrl.train.trainer import check_collection_size

    check_collection_size(12, 12)
    with pytest.raises(RuntimeError, match="holds 8 rollouts but the batch plan has 12"):
        check_collection_size(8, 12)  # nothing may take a group out, staleness included
    with pytest.raises(RuntimeError, match="holds 16 rollouts but the batch plan has 12"):
        check_collection_size(16, 12)

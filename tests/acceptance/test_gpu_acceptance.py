"""The GPU acceptance script runs end to end on the CPU (--dry-run), so it cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_acceptance_dry_run_passes_every_check_it_can_run_here() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_acceptance", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = [line for line in lines if line.startswith("[")]
    assert not [line for line in checks if line.startswith("[FAIL]")]
    passed = [line for line in checks if line.startswith("[PASS]")]
    for name in ("exits 0", "three training steps", "attention kernel as announced",
                 "FSDP2 over every rank", "two updates per collection",
                 "KL term active", "log-probs agree", "checkpoints written",
                 "[resume] --resume from step_2", "[resume] starts at the newest checkpoint",
                 "[resume] every step once", "[resume] counters continue",
                 "[resume] redone step 3 equals", "[rank-0 wait]",
                 "after sleep: the sync wakes only the weights",
                 "after sleep: the KV cache stays freed",
                 "[memory] an FSDP2-sharded training step"):
        assert any(name in line for line in passed), (name, lines)
    assert any(line.startswith("[SKIP] [vllm]") for line in checks)
    assert any("[engines]" in line for line in passed)  # two agentrl serve replicas, gloo
    assert any(line.startswith("[SKIP] [memory]") for line in checks)
    assert any("training tokens/s" in line for line in lines)


def test_gpu_acceptance_refuses_to_run_without_a_gpu_unless_dry_run() -> None:
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # also on a machine that has one
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_acceptance"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=no_gpu)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr


def _checks_of(monkeypatch, tmp_path, status, log, records, dry_run=False):
    """check_training's verdicts on a run that returned ``status``, ``log``, ``records``."""
    from bench import gpu_acceptance as acceptance

    monkeypatch.setattr(acceptance, "train",
                        lambda machine, engine, out, *_, **__: (status, log, records))
    report = acceptance.Report()
    machine = acceptance.Machine(dry_run, 0 if dry_run else 4, "cpu" if dry_run else "H100")
    acceptance.check_training(report, machine, "torch", tmp_path)
    return {c.name.removeprefix("[torch] "): c.status for c in report.checks}


def _step(step: int, **extra) -> dict:
    return {"step": step, "loss/policy_loss": 0.1, "loss/kl_loss": 0.01,
            "cumulative/updates": 2 * step, "num_sampled_tokens": 10,
            "num_trainable_tokens": 10, "time/generate": 1.0, "time/train": 1.0, **extra}


GOOD_LOG = "ranks: 4\nattention: torch varlen_attn (bfloat16)\n"


def test_each_training_check_can_fail(monkeypatch, tmp_path) -> None:
    good = [_step(s, **{"loss/mismatch_scored": 0.01}) for s in (1, 2, 3)]
    for step in (2, 3):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
    passing = _checks_of(monkeypatch, tmp_path, 0, GOOD_LOG, good)
    assert len(passing) == 8 and set(passing.values()) == {"PASS"}
    # a timeout or a run without steps is a FAIL, not a crash
    assert _checks_of(monkeypatch, tmp_path, None, "hung", []) == {
        "torchrun training over 4 ranks exits 0": "FAIL"}
    assert _checks_of(monkeypatch, tmp_path, 0, GOOD_LOG, [])[
        "three training steps in metrics.jsonl"] == "FAIL"
    # the per-row path where the varlen kernel was due; the agreement metric missing
    slow_path = GOOD_LOG.replace("torch varlen_attn (bfloat16)", "PyTorch SDPA per row, ...")
    assert _checks_of(monkeypatch, tmp_path, 0, slow_path, good)[
        "attention kernel as announced"] == "FAIL"
    no_metric = [_step(s) for s in (1, 2, 3)]
    assert _checks_of(monkeypatch, tmp_path, 0, GOOD_LOG, no_metric)[
        "engine and trainer log-probs agree"] == "FAIL"
    far = [_step(s, **{"loss/mismatch_scored": 0.2}) for s in (1, 2, 3)]
    assert _checks_of(monkeypatch, tmp_path, 0, GOOD_LOG, far)[
        "engine and trainer log-probs agree"] == "FAIL"
    (tmp_path / "checkpoints" / "step_2").rmdir()  # nothing to resume from
    assert _checks_of(monkeypatch, tmp_path, 0, GOOD_LOG, good)[
        "checkpoints written"] == "FAIL"


def test_the_gpu_run_uses_the_shipped_engine_settings() -> None:
    from bench.gpu_acceptance import Machine

    overrides = " ".join(Machine(False, 1, "H100").overrides("vllm"))
    assert "enforce_eager" not in overrides  # CUDA graphs, as in the shipped configs
    assert 'model.attention="auto"' in overrides

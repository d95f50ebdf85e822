"""The acceptance memory check (bench/memory.py) judges an FSDP2-sharded step's measured
peak against the plan and can fail: over the plan, far under it, or no measurement."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench.gpu_acceptance import Machine, Report
from bench.memory import MIN_PLAN_USE, memory_check

FIGURES = {"tokens": 16384.0, "num_micro_batches": 2, "planned_gib": 10.0,
           "terms": {"activations": 4.0, "backward working set": 6.0}}


def _verdicts(monkeypatch, tmp_path, figures, dry_run=False, returncode=0):
    seen = []

    def run(command, **_):
        seen.append(command)
        if figures is not None:
            out = command[command.index("--json") + 1]
            with open(out, "w") as f:
                json.dump(figures, f)
        return subprocess.CompletedProcess(command, returncode, "", "Traceback: boom")

    monkeypatch.setattr(subprocess, "run", run)
    report = Report()
    memory_check(report, Machine(dry_run, 4, "H100"), tmp_path)
    return [c.status for c in report.checks], seen[0]


@pytest.mark.parametrize("ratio, status", [(0.97, "PASS"), (1.02, "FAIL"),
                                           (MIN_PLAN_USE - 0.01, "FAIL"), (None, "FAIL")])
def test_the_measured_peak_must_sit_just_under_the_plan(monkeypatch, tmp_path, ratio,
                                                        status) -> None:
    measured = None if ratio is None else 10.0 * ratio
    verdicts, command = _verdicts(monkeypatch, tmp_path,
                                  {**FIGURES, "ratio": ratio, "measured_gib": measured})
    assert verdicts == ["PASS", status]
    # torchrun over every GPU, each rank building the sharded policy
    assert command[command.index("--nproc-per-node") + 1] == "4" and "--sharded-step" in command


def test_a_failed_step_fails_both_and_a_dry_run_skips_only_the_cuda_figure(
        monkeypatch, tmp_path) -> None:
    assert _verdicts(monkeypatch, tmp_path, None, returncode=1)[0] == ["FAIL", "FAIL"]
    (tmp_path / "dry").mkdir()
    dry, command = _verdicts(monkeypatch, tmp_path / "dry",
                             {**FIGURES, "ratio": None, "measured_gib": None}, dry_run=True)
    assert dry == ["PASS", "SKIP"] and 'model.dtype="float32"' in command

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
    for name in ("exits 0", "FSDP2 over every rank", "two updates per collection",
                 "KL term active", "log-probs agree", "checkpoint written"):
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

"""The engine checks of the GPU acceptance run execute on the CPU (--dry-run): two
`agentrl serve` replicas, a gloo sync that changes and restores their greedy tokens with
the version bumped twice, and sleep/wake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_checks_dry_run_passes():
    proc = subprocess.run([sys.executable, "-m", "bench.engine_scaling", "--gpu", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    checks = [line for line in lines if line.startswith("[")]
    assert checks[0] == ("[PASS] [engines] 2 agentrl serve replicas, gloo: every replica "
                         "serves the new weights: versions 0 -> 2"), proc.stdout
    after_sleep = "[engines] colocated agentrl serve replicas, gloo, after sleep: "
    assert [c.split(": ")[1] for c in checks[1:]] == [
        "every replica serves the new weights", "the sync wakes only the weights, the "
        "generation the rest", "the KV cache stays freed through the sync",
        "sleep frees GPU memory, the sync takes back the weights alone"], proc.stdout
    assert all(after_sleep in c for c in checks[1:])
    assert [c.split("]")[0] for c in checks] == ["[PASS"] * 4 + ["[SKIP"], proc.stdout
    assert any("weight sync s/GB" in line for line in lines)

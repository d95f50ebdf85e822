"""bench/context_strategies.py: its paired interval, its summary of finished runs, and a
smoke run of the real training command (``--quick``, one strategy, one seed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench import context_strategies as bench


def fake_run(folder: Path, accuracies: list[float], outcomes: list[int]) -> Path:
    """A finished run's files: one validation per step of 4 rollouts, the last outcomes."""
    folder.mkdir(parents=True)
    records = [{"step": i, "num_rollouts": 4, "eval/accuracy": a}
               for i, a in enumerate(accuracies)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "eval_tasks.jsonl").write_text(json.dumps({"tasks": {"ledger": outcomes}}) + "\n")
    (folder / "done").write_text("60.0\n")
    return folder


def test_the_paired_interval_resamples_tasks_jointly_across_seeds():
    a = np.array([[1, 1, 0, 1], [1, 0, 0, 1]], dtype=float)  # [seeds, tasks]
    b = np.array([[0, 1, 0, 0], [0, 0, 0, 1]], dtype=float)
    diff, low, high = bench.paired_interval(a, b)
    assert diff == (a - b).mean()
    per_task = (a - b).mean(axis=0)  # resampling tasks: the interval lies in their range
    assert per_task.min() <= low <= diff <= high <= per_task.max()
    same = bench.paired_interval(a, a)
    assert same == (0.0, 0.0, 0.0)


def test_the_summary_holds_curves_last_accuracies_and_every_difference(tmp_path):
    runs = {"tool": [fake_run(tmp_path / "t0", [0.5, 1.0], [1, 1, 1, 1]),
                     fake_run(tmp_path / "t1", [0.5, 0.5], [1, 1, 0, 0])],
            "drop_oldest": [fake_run(tmp_path / "d0", [0.0, 0.0], [0, 0, 0, 0]),
                            fake_run(tmp_path / "d1", [0.0, 0.25], [0, 1, 0, 0])]}
    summary = bench.summarize(runs)
    tool = summary["strategies"]["tool"]
    assert tool["rollouts"] == [4, 8] and tool["accuracy"] == [0.5, 0.75]
    assert tool["last_per_seed"] == [1.0, 0.5] and tool["minutes_per_run"] == [1.0, 1.0]
    (difference,) = summary["differences"]
    assert (difference["a"], difference["b"]) == ("tool", "drop_oldest")
    assert difference["diff"] == 0.75 - 0.125


def test_a_quick_run_trains_evaluates_and_plots(tmp_path, capsys):
    out = tmp_path / "grid"
    assert bench.main(["--quick", "--seeds", "1", "--strategies", "tool", "--out", str(out),
                       "--set", "train.num_steps=1", "--set", "train.eval_every=1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    tool = summary["strategies"]["tool"]
    assert tool["rollouts"] == [0, 4] and len(tool["last_per_seed"]) == 1
    assert (out / "strategies.png").stat().st_size > 0
    assert "held-out accuracy" in capsys.readouterr().out

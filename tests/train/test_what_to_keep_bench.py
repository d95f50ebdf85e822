"""bench/what_to_keep.py: its summary of finished runs (before and after RL, the paired
gain, fact survival, the arms' gap), from hand-made run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import what_to_keep as bench


def fake_run(folder: Path, before: list[int], after: list[int],
             survival: list[float]) -> Path:
    """A finished run: validations before and after RL, one survival figure per step."""
    folder.mkdir(parents=True)
    validations = [{"tasks": {"drill": before}}, {"tasks": {"drill": after}}]
    (folder / "eval_tasks.jsonl").write_text("".join(json.dumps(v) + "\n" for v in validations))
    steps = [{"step": i + 1, "compaction/fact_survival": s} for i, s in enumerate(survival)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (folder / "done").write_text("120.0\n")
    return folder


def test_the_summary_gives_each_arms_gain_survival_and_the_gap(tmp_path, capsys):
    before = [0, 0, 1, 0]
    runs = {"train": [fake_run(tmp_path / "t0", before, [1, 1, 1, 0], [0.2, 0.3, 0.4, 0.9]),
                      fake_run(tmp_path / "t1", before, [1, 0, 1, 1], [0.3, 0.3, 0.3, 0.7])],
            "mask": [fake_run(tmp_path / "m0", before, [0, 0, 1, 0], [0.2, 0.2, 0.2, 0.2]),
                     fake_run(tmp_path / "m1", before, [0, 1, 1, 0], [0.3, 0.3, 0.3, 0.3])]}
    summary = bench.summarize(runs)
    train, mask = summary["arms"]["train"], summary["arms"]["mask"]
    assert train["before"] == 0.25 and train["after"] == 0.75
    assert train["gain"] == pytest.approx(0.5) and train["low"] <= 0.5 <= train["high"]
    assert train["survival_first"] == pytest.approx((0.3 + 0.3) / 2)  # first 3 steps
    assert train["survival_last"] == pytest.approx((1.6 / 3 + 1.3 / 3) / 2)  # last 3 steps
    assert mask["gain"] == pytest.approx(0.125) and train["minutes_per_run"] == [2.0, 2.0]
    assert summary["difference"]["diff"] == pytest.approx(0.5 - 0.125)
    bench.print_summary(summary)
    assert "gain(train) - gain(mask): +0.375" in capsys.readouterr().out


def test_the_warm_start_keeps_the_copy_circuit_and_takes_another_base(tmp_path, monkeypatch):
    """The warm start runs `agentrl sft` with 8 copy rows and any --base, once per folder."""
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(bench, "agentrl", lambda *argv: calls.append(argv))
    bench.warm_start(tmp_path, False, ["--base", "runs/other-base"])
    (argv,) = calls
    assert argv[:2] == ("sft", str(bench.CONFIG))
    assert argv[argv.index("--copy-rows") + 1] == "8"
    assert argv[-2:] == ("--base", "runs/other-base")
    (tmp_path / "warm-start").mkdir()
    (tmp_path / "warm-start" / "config.json").write_text("{}")
    bench.warm_start(tmp_path, False, [])  # an existing warm start is reused
    assert len(calls) == 1

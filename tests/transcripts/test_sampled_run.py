"""A real training run writes its rollout samples; `agentrl inspect RUN_DIR` shows them."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from agentrl.cli import main
from agentrl.transcripts.store import read_records, sampled_steps
from tests.transcripts.conftest import PAYLOAD


def test_every_step_samples_best_worst_and_random_per_environment(sampled_run) -> None:
    assert sampled_steps(sampled_run) == [1, 2]
    for step in (1, 2):
        records = read_records(sampled_run, [step])
        assert [(r.env, r.selection) for r in records] == [
            ("longtool", "best"), ("longtool", "worst"), ("longtool", "random"),
            ("short", "best"), ("short", "worst"), ("short", "random")]
        best, worst = records[0], records[1]
        assert best.reward >= worst.reward and all(r.step == step for r in records)
    metrics = [json.loads(line) for line in (sampled_run / "metrics.jsonl").open()]
    assert all(m["log/rollout_sample_bytes"] > 0 and m["time/rollout_sample"] >= 0
               for m in metrics if m["step"] > 0)


def test_row_advantages_are_the_trainers(sampled_run) -> None:
    """GRPO mean baseline: reward − advantage is the same for every sampled rollout of a
    group, and every row of a rollout carries the one advantage."""
    baselines = defaultdict(set)
    for record in read_records(sampled_run):
        advantages = {row.advantage for row in record.rows}
        assert len(advantages) == 1
        baselines[(record.step, record.group_id)].add(round(record.reward - advantages.pop(), 9))
    assert baselines and all(len(b) == 1 for b in baselines.values())
    assert any(r.rows[0].advantage != 0 for r in read_records(sampled_run))


def test_compaction_is_recorded_with_the_newest_tool_result_kept(sampled_run) -> None:
    for record in read_records(sampled_run, env="longtool"):
        assert record.num_compactions >= 1 and record.num_rows == record.num_compactions + 1
        assert record.tool_errors == {"tool_exception": 1}
        first, later = record.rows[0], record.rows[1]
        assert [s.source for s in first.spans][:3] == ["prompt", "generated", "observation"]
        tool = first.spans[2].messages[0]
        assert tool.role == "tool" and tool.text.startswith(f"report 1: {PAYLOAD}")
        prompt = later.spans[0].messages
        assert any(p.kind == "note" and "earlier turn(s) were removed" in p.text
                   for m in prompt for p in m.parts)
        assert prompt[-1].role == "tool" and prompt[-1].text.startswith("report 2:")
        assert record.num_tokens == sum(row.num_tokens for row in record.rows)


def test_inspect_run_dir_renders_turns_rows_and_compaction(sampled_run, capsys,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["inspect", str(sampled_run), "--step", "1", "--env", "longtool"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 1 · longtool · ") == 3 and "· short ·" not in out
    assert ("compaction 1 (by the context budget, drop_oldest): row 1 starts from a "
            "compacted context") in out
    assert "row 0 · advantage " in out and "row 1 · advantage " in out
    assert PAYLOAD in out  # rich markup and HTML in model/env text print as written
    assert "tool errors: tool_exception 1" in out and "reward " in out
    assert "sampled steps 1-2" in out
    assert main(["inspect", str(sampled_run)]) == 0  # default: the last sampled step
    out = capsys.readouterr().out
    assert "step 2 · longtool" in out and "step 2 · short" in out and "step 1 ·" not in out


def test_inspect_run_dir_names_what_exists(sampled_run, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"sampled steps: 1-2"):
        main(["inspect", str(sampled_run), "--step", "9"])
    with pytest.raises(ValueError, match=r"environments: longtool, short"):
        main(["inspect", str(sampled_run), "--env", "nope"])
    with pytest.raises(ValueError, match="log.rollouts_every"):
        main(["inspect", str(tmp_path)])
    with pytest.raises(ValueError, match="does not exist; give a run folder"):
        main(["inspect", str(tmp_path / "missing")])

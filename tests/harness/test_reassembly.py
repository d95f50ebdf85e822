"""Reassembly without drift: an agent program's requests become the rows of its rollout.

Each harness here is a file that imports nothing from agentrl and talks to the endpoint
with the official ``openai`` client; the rows are checked against what the engine was
really asked and what it generated (``assert_rows_hold_what_the_engine_saw``), and
``agentrl inspect`` and ``agentrl view`` (in a headless Chromium) mark where a row starts
anew: a harness compaction with its reason, drift.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from agentrl.advantage import compute_advantages
from agentrl.cli import main
from agentrl.envs.registry import make
from agentrl.observe.metrics import rollout_figures
from agentrl.reassembler import to_rows
from agentrl.transcripts.record import build_record
from agentrl.transcripts.store import RolloutSampleWriter
from agentrl.transcripts.terminal import render_records
from agentrl.types import as_dicts
from tests.harness.conftest import (
    AGENTS,
    CALC_AGENT,
    SFT,
    assert_rows_hold_what_the_engine_saw,
    collect,
    harness_config,
)
from tests.transcripts.test_view_page import Elements, dump_page, parse


def test_a_tool_calling_loop_is_one_row_identical_to_the_built_in_loop() -> None:
    # greedy, one rollout: the harness's row and the built-in runner's row are the same
    # ids (the calculator tool implemented in the harness, answers as the env's tool)
    config = harness_config(SFT, {"run": f"{CALC_AGENT}:run"},
                            rollout={"temperature": 0.0, "max_new_tokens": 40})
    harnessed, engine, _ = collect(config, SFT)
    built_in = msgspec.structs.replace(config, environments=[msgspec.structs.replace(
        config.environments[0], harness=None)])
    plain, _, _ = collect(built_in, SFT)
    [mine], [theirs] = harnessed.rollouts, plain.rollouts
    assert mine.valid and mine.stats.num_turns == 2  # a tool call, then the answer
    assert len(mine.segments) == 1 and mine.stats.num_compactions == 0
    assert mine.segments[0].token_ids == theirs.segments[0].token_ids
    assert mine.segments[0].loss_mask == theirs.segments[0].loss_mask
    assert mine.reward == theirs.reward
    assert_rows_hold_what_the_engine_saw(mine, engine.calls)
    # the same requests, metered through the endpoint as through the built-in loop
    spent, reference = mine.stats.spend, theirs.stats.spend
    assert spent.num_prompt_tokens == reference.num_prompt_tokens > 0
    assert spent.num_generated_tokens == reference.num_generated_tokens == sum(
        s.num_generated_tokens for s in mine.segments)
    assert spent.generation_s > 0 and spent.env_s > 0


@pytest.fixture(scope="module")
def rewritten(tiny_dir) -> tuple:
    """One group of 3 rollouts of the harness that rewrites its history every third turn:
    (collection result, recording engine, tokenizer)."""
    config = harness_config(tiny_dir, {"run": f"{AGENTS / 'rewriting_agent.py'}:run",
                                       "grader": f"{AGENTS / 'graders.py'}:yes"},
                            group_size=3)
    return collect(config, tiny_dir)


@pytest.fixture(scope="module")
def edited(tiny_dir) -> tuple:
    """One group of 2 rollouts of the harness that sends back an edited assistant
    message: (collection result, recording engine, tokenizer)."""
    config = harness_config(tiny_dir, {"run": f"{AGENTS / 'editing_agent.py'}:run"},
                            group_size=2)
    return collect(config, tiny_dir)


def test_a_harness_that_rewrites_its_history_gives_rows_of_one_rollout(rewritten) -> None:
    result, engine, tokenizer = rewritten
    by_id = {r.rollout_id.rsplit("-", 1)[-1]: r for r in result.rollouts}
    r0, r1, r2 = by_id["r0"], by_id["r1"], by_id["r2"]
    # 6 requests with rewrites before requests 3 and 6: 3 rows; 3 requests: 2; 2: 1
    assert [len(r.segments) for r in (r0, r1, r2)] == [3, 2, 1]
    assert r0.stats.num_compactions == 2 and r0.stats.harness_compactions() == {"rewritten": 2}
    assert [s.boundary for s in r0.segments] == ["", "harness_compaction:rewritten",
                                                 "harness_compaction:rewritten"]
    # the same records as the runner's compactions: each ends the row before it
    assert [(c.cause, c.strategy, c.segment) for c in r0.stats.compactions] == [
        ("harness", "rewritten", 0), ("harness", "rewritten", 1)]
    for rollout in (r0, r1, r2):
        assert rollout.valid
        assert_rows_hold_what_the_engine_saw(rollout, engine.calls)
    # a rewritten row starts from exactly the template's rendering of what was sent
    messages, _ = make("agentrl/Calculator-v0", max_number=9).reset(
        seed=result.groups[0].task_seed)
    sent = [*as_dicts(messages),
            {"role": "user", "content": "Summary of the first 2 turns: keep going."}]
    second = r0.segments[1]
    assert second.token_ids[:second.num_prompt_tokens] == tokenizer.encode(
        tokenizer.apply_chat_template(sent, add_generation_prompt=True))
    # one reward per rollout, one advantage on all its rows, by hand: rewards 1, 0, 0, mean
    # baseline 1/3 (counting rows would give 3/6: +0.5 / -0.5)
    rows = to_rows([r0, r1, r2])
    assert [row.reward for row in rows] == [1.0] * 3 + [0.0] * 3
    assert compute_advantages(rows) == pytest.approx([2 / 3] * 3 + [-1 / 3] * 3)
    figures = rollout_figures([r0, r1, r2], "env/agent/")
    assert figures["env/agent/harness_compactions/rewritten"] == 3.0
    assert figures["env/agent/compaction/compacted_share"] == pytest.approx(2 / 3)
    assert figures["env/agent/compaction/by_budget/mean"] == 0.0
    record = build_record(r0, {0: 2 / 3, 1: 2 / 3, 2: 2 / 3}, tokenizer, 1, "best")
    assert record.rows[1].compaction.startswith("harness compaction (rewritten)")


def test_an_edited_assistant_message_is_drift_and_never_trained(edited) -> None:
    result, engine, tokenizer = edited
    for rollout in result.rollouts:
        assert rollout.valid and rollout.stats.num_drift == 1
        assert rollout.stats.num_compactions == 0
        assert [s.boundary for s in rollout.segments] == ["", "drift:edited_assistant"]
        assert_rows_hold_what_the_engine_saw(rollout, engine.calls)
        # the edited text is in the new row's prompt only: no trained token comes from it
        second = rollout.segments[1]
        prompt = tokenizer.decode(second.token_ids[:second.num_prompt_tokens])
        assert "I edited this reply." in prompt
        trained = [t for t, m in zip(second.token_ids, second.loss_mask, strict=True) if m]
        assert "I edited" not in tokenizer.decode(trained)
    # counted per environment
    assert rollout_figures(result.rollouts, "env/agent/")["env/agent/harness_drift"] == 2.0
    record = build_record(result.rollouts[0], {}, tokenizer, 1, "best")
    assert record.num_drift == 1 and record.rows[1].compaction.startswith("drift (edited")


def test_concurrent_requests_of_one_session_are_threads_of_one_rollout(tiny_dir) -> None:
    config = harness_config(tiny_dir, {"run": f"{AGENTS / 'parallel_agent.py'}:run"})
    result, engine, tokenizer = collect(config, tiny_dir)
    [rollout] = result.rollouts
    assert rollout.valid and rollout.stats.num_turns == 4
    assert sorted(s.thread for s in rollout.segments) == ["main", "t1", "t2"]
    assert [(t.parent, t.depth) for t in rollout.threads] == [("main", 1), ("main", 1)]
    main = next(s for s in rollout.segments if s.thread == "main")
    assert main.num_generated_tokens == sum(  # the main thread's two turns joined in one row
        len(g) for _, p, g in engine.calls if p[:main.num_prompt_tokens] == main.token_ids[
            :main.num_prompt_tokens])
    assert_rows_hold_what_the_engine_saw(rollout, engine.calls)
    rows = to_rows([rollout])
    assert {row.thread for row in rows} == {"main", "t1", "t2"}
    assert len(set(compute_advantages(rows))) == 1  # one advantage on every thread's rows
    # inspect draws the tree: each other conversation after main's rows, with no answer line
    console = Console(record=True, width=200)
    render_records([build_record(rollout, {}, tokenizer, 1, "best")], console)
    plain = console.export_text()
    assert plain.count("← main called the endpoint") == 2 and "3 threads" in plain
    assert "no answer" not in plain and "returned to" not in plain


@pytest.fixture(scope="module")
def view_page(rewritten, edited, tmp_path_factory) -> Path:
    """`agentrl view` of a run folder holding what training samples of two steps: step 1
    the rewriting group, step 2 the editing one (every rollout, with its advantages)."""
    run = tmp_path_factory.mktemp("harness-view")
    writer = RolloutSampleWriter(run, rewritten[2], every=1, num_random=8, seed=0)
    for step, (result, _, _) in enumerate((rewritten, edited), start=1):
        rows = to_rows(result.rollouts)
        writer.write(step, result.rollouts, rows, compute_advantages(rows))
    assert main(["view", str(run), "--out", str(run / "view.html")]) == 0
    return run / "view.html"


def marked(rewritten, edited) -> tuple[str, str]:
    """The page keys (step:rollout id) of the rollout with two harness compactions (the
    rewriting group's r0) and of one with drift (the editing group's first)."""
    r0 = next(r for r in rewritten[0].rollouts if r.rollout_id.endswith("-r0"))
    return f"1:{r0.rollout_id}", f"2:{edited[0].rollouts[0].rollout_id}"


REWRITTEN_NOTE = ("harness compaction (rewritten): row {} starts where the program's request "
                  "did not extend its previous one")
DRIFT_NOTE = ("drift (edited assistant): row 1 starts anew; the edited text is prompt here, "
              "never trained")


def test_the_view_page_carries_harness_compactions_and_drift(view_page, rewritten,
                                                             edited) -> None:
    # what the page's script draws its markers from: a rollout's reasons (a badge each),
    # its drift count (a badge), and the note of each row that starts anew (a marker)
    data = re.search(r'<script type="application/json" id="rollout-data">(.*?)</script>',
                     view_page.read_text(), re.S).group(1)
    shown = {f"{r['step']}:{r['rollout_id']}": r for r in json.loads(data)["rollouts"]}
    compacted, drifted = (shown[key] for key in marked(rewritten, edited))
    assert compacted["compaction_reasons"] == {"rewritten": 2}
    assert compacted["num_compactions"] == 2 and "num_drift" not in compacted  # 0: omitted
    assert [row.get("compaction") for row in compacted["rows"]] == [
        None, REWRITTEN_NOTE.format(1), REWRITTEN_NOTE.format(2)]
    assert drifted["num_drift"] == 1 and drifted["num_compactions"] == 0
    assert "compaction_reasons" not in drifted  # {}: omitted
    assert [row.get("compaction") for row in drifted["rows"]] == [None, DRIFT_NOTE]


def shown(page: Path, fragment: str, profile: Path) -> Elements:
    """What the browser built from the page, without the scripts (the data holds the
    notes too, and the script the badges' words)."""
    return parse(re.sub(r"<script.*?</script>", "", dump_page(page, fragment, profile),
                        flags=re.S))


def test_the_browser_shows_the_harness_markers(view_page, rewritten, edited, tmp_path) -> None:
    compacted, drifted = marked(rewritten, edited)
    dom = shown(view_page, f"#step=1&rollout={compacted}", tmp_path / "p1")
    assert [a["data-key"] for a in dom.with_class("rollout")] == [compacted]
    assert "harness compaction rewritten × 2" in dom.text and "2 compacted" in dom.text
    assert len(dom.with_class("compaction-marker")) == 2
    assert REWRITTEN_NOTE.format(1) in dom.text and REWRITTEN_NOTE.format(2) in dom.text
    assert "drift ×" not in dom.text
    dom = shown(view_page, f"#step=2&rollout={drifted}", tmp_path / "p2")
    assert [a["data-key"] for a in dom.with_class("rollout")] == [drifted]
    assert "drift × 1" in dom.text and "harness compaction" not in dom.text
    assert len(dom.with_class("compaction-marker")) == 1 and DRIFT_NOTE in dom.text

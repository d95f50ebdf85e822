"""Transcript records from hand-built rollouts: decoded turns, tool calls and results,
compaction summaries, per-row advantages as given, reasons and versions when present;
which rollouts a step keeps; the writer's schedule and resume."""

from __future__ import annotations

import msgspec
import pytest

from agentrl.model import load_tokenizer
from agentrl.reassembler import to_rows
from agentrl.rollout.compaction import SUMMARY_REQUEST
from agentrl.rollout.context import ChatContext
from agentrl.transcripts.chat_text import assistant_message, split_messages
from agentrl.transcripts.record import build_record
from agentrl.transcripts.store import (
    RolloutSampleWriter,
    choose,
    read_step,
    sample_path,
    sampled_steps,
)
from agentrl.types import Message, Rollout, RolloutStats, Segment
from tests.factories import rollout

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find a key.",
                                            "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "k7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def summarized_rollout(tokenizer) -> Rollout:
    """Row 0: task, a tool call, its result, the summary request and the summary; row 1
    starts from the summary (what the summarize compactor builds)."""
    eos = tokenizer.eos_token_id
    head = [Message("system", "Find the value."), Message("user", "Look up k7.")]
    context = ChatContext(tokenizer, TOOLS, head)
    prompt = context.prompt_ids()
    call_ids = tokenizer.encode("Let me look. " + CALL) + [eos]
    request = {"role": "user", "content": SUMMARY_REQUEST}
    _, ask_ids = context.turn_delta(call_ids, (eos,), [Message("tool", "k7 = 42", "lookup"),
                                                       request])
    summary_ids = tokenizer.encode("k7 is 42.") + [eos]
    ids = prompt + call_ids + ask_ids + summary_ids
    mask = [0] * len(prompt) + [1] * len(call_ids) + [0] * len(ask_ids) + [1] * len(summary_ids)
    # version 3 made the call, version 4 (an in-flight update) the summary
    summary_start = len(prompt) + len(call_ids) + len(ask_ids)
    first = Segment(ids, mask, [0.0] * len(ids), len(prompt),
                    version_runs=[(len(prompt), 3), (summary_start, 4)])
    context.head = [*head, {"role": "user", "content": "Summary of your earlier progress:\n"
                                                      "k7 is 42."}]
    second_prompt = context.prompt_ids()
    answer = tokenizer.encode("42") + [eos]
    second = Segment(second_prompt + answer, [0] * len(second_prompt) + [1] * len(answer),
                     [0.0] * (len(second_prompt) + len(answer)), len(second_prompt))
    stats = RolloutStats(num_turns=2, num_compactions=1, truncated=True,
                         truncation_reason="max_turns", tool_errors={"timeout": 1})
    return Rollout("s3-g0-r1", "s3-g0", "kv", [first, second], 1.0, stats=stats)


def test_a_rollout_decodes_into_turns_tool_calls_results_and_summary(tokenizer) -> None:
    record = build_record(summarized_rollout(tokenizer), {0: 0.25, 1: 0.25}, tokenizer, 3,
                          "best")
    first, second = record.rows
    assert [s.source for s in first.spans] == ["prompt", "generated", "observation",
                                               "generated"]
    prompt, call, observation, summary = first.spans
    assert [m.role for m in prompt.messages] == ["system", "user"]
    assert prompt.messages[0].text.startswith("Find the value.")  # tool schemas follow it
    assert prompt.messages[1].text == "Look up k7."
    assert [(p.kind, p.text) for p in call.messages[0].parts] == [
        ("text", "Let me look. "), ("tool_call", CALL)]
    assert [(m.role, m.text) for m in observation.messages] == [
        ("tool", "k7 = 42"), ("user", SUMMARY_REQUEST)]
    assert observation.messages[1].parts[0].kind == "note"
    assert summary.summary and not call.summary and summary.messages[0].text == "k7 is 42."
    assert (call.policy_versions, summary.policy_versions) == ([3], [4])
    assert first.policy_versions == [3, 4] and second.policy_versions == []
    assert record.policy_versions == [3, 4]
    carried = second.spans[0].messages[-1]
    assert carried.parts[0].kind == "note" and carried.text.endswith("k7 is 42.")
    assert second.spans[1].messages[0].text == "42"
    assert (first.advantage, second.advantage) == (0.25, 0.25)
    assert (record.num_rows, record.num_turns, record.num_compactions) == (2, 2, 1)
    assert record.num_tokens == first.num_tokens + second.num_tokens
    assert (record.truncated, record.truncation_reason) == (True, "max_turns")
    assert record.tool_errors == {"timeout": 1} and record.valid


def test_invalid_reasons_come_from_the_rollout() -> None:
    masked = rollout("a", "g", 0.0, valid=False)
    masked.stats = RolloutStats(error="env.step timed out after 30.0s")
    named = rollout("b", "g", 0.0, valid=False)
    named.stats = RolloutStats(error="env.step returned None", error_kind="bad_reward")
    unnamed = rollout("c", "g", 0.0, num_rows=2, valid=False)

    class Raw:
        def decode(self, ids):
            return ""

    reasons = [build_record(r, {}, Raw(), 1, "random") for r in (masked, named, unnamed)]
    assert [r.invalid_reason for r in reasons] == [
        "env.step timed out after 30.0s", "bad_reward: env.step returned None",
        "marked invalid"]
    assert not any(r.valid for r in reasons)


def test_other_chat_formats_split_and_unknown_text_stays_whole() -> None:
    llama = ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert [(m.role, m.text) for m in split_messages(llama)] == [("system", "Be brief."),
                                                                  ("user", "Hi")]
    assert [(m.role, m.text) for m in split_messages("  plain words\n")] == [
        ("text", "plain words")]
    cut = assistant_message("ok <tool_call>{\"name\": ")  # generation ran out mid-call
    assert [p.kind for p in cut.parts] == ["text", "tool_call"]
    assert assistant_message("done<|im_end|>").text == "done"


def test_choose_keeps_best_worst_and_seeded_random_per_environment() -> None:
    rollouts = [rollout(f"x{i}", "gx", r, env="x") for i, r in enumerate([0.2, 0.9, 0.0, 0.5,
                                                                          0.9, 0.3])]
    rollouts += [rollout("y0", "gy", 1.0, env="y")]
    picked = choose(rollouts, num_random=2, seed=0, step=4)
    x = [(r.rollout_id, why) for r, why in picked if r.env == "x"]
    assert x[:2] == [("x1", "best"), ("x2", "worst")]  # the first 0.9 wins the tie
    assert [why for _, why in x[2:]] == ["random", "random"]
    assert {rid for rid, _ in x[2:]} <= {"x0", "x3", "x4", "x5"}
    assert [(r.rollout_id, why) for r, why in picked if r.env == "y"] == [("y0", "best")]
    assert picked == choose(rollouts, 2, seed=0, step=4)  # reproducible
    draws = {tuple(r.rollout_id for r, _ in choose(rollouts, 2, 0, s)[2:4]) for s in range(8)}
    assert len(draws) > 1  # the step reseeds the draw


def test_writer_schedule_and_resume(tmp_path, tokenizer) -> None:
    batch = [rollout("a", "g", 1.0), rollout("b", "g", 0.0)]

    def write(writer, step):
        rows = to_rows(batch)
        return writer.write(step, batch, rows, [0.5 if r.rollout_id == "a" else -0.5
                                                for r in rows])

    writer = RolloutSampleWriter(tmp_path, tokenizer, every=2, num_random=0, seed=0)
    assert write(writer, 1) == {} and sampled_steps(tmp_path) == []
    figures = write(writer, 2)
    assert figures["log/rollout_sample_bytes"] == sample_path(tmp_path, 2).stat().st_size
    records = read_step(tmp_path, 2)
    assert [(r.rollout_id, r.selection, r.rows[0].advantage) for r in records] == [
        ("a", "best", 0.5), ("b", "worst", -0.5)]
    write(writer, 4)
    RolloutSampleWriter(tmp_path, tokenizer, every=2, num_random=0, seed=0, resume_step=2)
    assert sampled_steps(tmp_path) == [2]  # step 4 is trained again after the resume
    RolloutSampleWriter(tmp_path, tokenizer, every=2, num_random=0, seed=0)
    assert sampled_steps(tmp_path) == []  # a fresh run starts with no stale samples
    off = RolloutSampleWriter(tmp_path, tokenizer, every=0, num_random=0, seed=0)
    assert write(off, 2) == {} and sampled_steps(tmp_path) == []


def test_records_round_trip_and_tolerate_a_line_cut_short(tmp_path, tokenizer) -> None:
    record = build_record(summarized_rollout(tokenizer), {0: 0.1, 1: 0.1}, tokenizer, 7,
                          "random")
    path = sample_path(tmp_path, 7)
    path.parent.mkdir(parents=True)
    line = msgspec.json.encode(record)
    path.write_bytes(line + b"\n" + line[: len(line) // 2])
    assert read_step(tmp_path, 7) == [record]


def test_versions_recorded_on_the_rows_are_shown(tmp_path, tokenizer) -> None:
    batch = [rollout("a", "g", 1.0, num_rows=2), rollout("b", "g", 0.0)]
    for r in batch:  # row i generated by version 5 + i
        for i, segment in enumerate(r.segments):
            segment.version_runs = [(segment.num_prompt_tokens, 5 + i)]
    rows = to_rows(batch)
    writer = RolloutSampleWriter(tmp_path, tokenizer, every=1, num_random=0, seed=0)
    writer.write(1, batch, rows, [0.5, 0.5, -0.5])
    best, worst = read_step(tmp_path, 1)
    assert [r.policy_versions for r in best.rows] == [[5], [6]]
    assert best.policy_versions == [5, 6] and worst.policy_versions == [5]
    assert [r.advantage for r in best.rows] == [0.5, 0.5] and worst.rows[0].advantage == -0.5


def test_terminal_highlights_tool_calls_and_marks_summaries(tokenizer) -> None:
    import re

    from rich.console import Console

    from agentrl.transcripts.terminal import render_records

    record = build_record(summarized_rollout(tokenizer), {0: 0.25, 1: 0.25}, tokenizer, 3,
                          "best")
    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    render_records([record], console)
    plain = console.export_text(styles=False, clear=False)
    assert "truncated (max_turns)" in plain and "tool errors: timeout 1" in plain
    assert "policy versions 3–4" in plain and "row 0 · advantage +0.25" in plain
    summary = record.rows[0].spans[3]
    assert f"assistant (summary) ({summary.num_tokens} tokens, policy 4) │ k7 is 42." in plain
    assert "compaction 1: row 1 starts from a compacted context" in plain
    styled = console.export_text(styles=True)
    # the call is printed in yellow (33), its surrounding text is not
    assert re.search(r"\x1b\[[0-9;]*33[0-9;]*m<tool_call>", styled)
    assert not re.search(r"\x1b\[[0-9;]*33[0-9;]*mLet me look", styled)


def test_a_compaction_note_names_its_cause_and_the_facts_it_lost():
    from agentrl.transcripts.record import compaction_note
    from agentrl.types import Compaction

    note = compaction_note(2, Compaction("budget", "summarize", 1, "Entry: x.", 5,
                                         ["x", "birch"], ["x"]))
    assert note == ("compaction 2 (by the context budget, summarize): row 2 starts from a "
                    "compacted context · summary 5 tokens · kept 1 of 2 needed facts seen "
                    "(lost: birch)")
    tool = compaction_note(1, Compaction("tool", "tool", 0, "s", 3, ["x"], ["x"]))
    assert "by the policy's compact call" in tool and "(all)" in tool

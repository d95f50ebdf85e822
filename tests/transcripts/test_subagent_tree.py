"""A rollout tree as text: `agentrl inspect` and the view page draw each subagent thread
after its caller, indented, from the call that started it (with its rows and
compactions) to the answer it returned."""

from __future__ import annotations

import asyncio
import re

from rich.console import Console

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.model import build_tiny_checkpoint, load_tokenizer
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.transcripts.page import render_page, script_json
from agentrl.transcripts.record import build_record, thread_blocks
from agentrl.transcripts.terminal import render_records
from tests.rollout.subagent_stand_ins import Archive, TextPolicyEngine


def tree_record(tmp_path):
    tokenizer = load_tokenizer(build_tiny_checkpoint(
        tmp_path / "ckpt", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        vocab_size=400, seed=0))
    spec = RolloutSpec("s2-g0-r1", "s2-g0", "archive", task_seed=5, sampling_seed=1)
    rollout_cfg = RolloutConfig(max_new_tokens=120, max_turns=4, max_subagent_tokens=200,
                                max_subagent_depth=2, max_subagents_per_rollout=3)
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=760,
                                  keep_last_turns=1)
    rollout = asyncio.run(play_rollout(spec, Archive(num_shelves=2, padding=20),
                                       TextPolicyEngine(tokenizer, mode="nest"), tokenizer,
                                       rollout_cfg, compaction))
    advantages = {i: 0.25 for i in range(len(rollout.segments))}
    return rollout, build_record(rollout, advantages, tokenizer, 2, "best")


def test_inspect_draws_the_tree_with_calls_rows_compactions_and_answers(tmp_path) -> None:
    rollout, record = tree_record(tmp_path)
    blocks = thread_blocks(record)
    # depth first: 1, its child 1.1 (whose own call would pass the depth limit, so it
    # read the shelf itself), then 2, whose call passed max_subagents_per_rollout
    assert [(b.thread_id, b.depth, len(b.rows)) for b in blocks] == [
        ("main", 0, 1), ("1", 1, 1), ("1.1", 2, 2), ("1.1.1", 3, 0), ("2", 1, 2),
        ("2.1", 2, 0)]
    assert rollout.reward == 1.0 and rollout.valid
    console = Console(record=True, width=200)
    render_records([record], console)
    lines = console.export_text().splitlines()
    assert "4 threads (main + 3 subagent)" in lines[1]

    def line_with(text: str) -> str:
        return next(line for line in lines if text in line)

    assert line_with("thread 1 ← main called delegate(shelf=0)").startswith(" " * 4)
    assert line_with("thread 1.1 ← 1 called delegate(shelf=0)").startswith(" " * 8)
    assert line_with("row 2 · thread 1.1 · advantage +0.25").startswith(" " * 8)
    # a subagent's compaction is noted at its own row, numbered among the rollout's rows
    assert line_with("compaction 3 (by the context budget, drop_oldest): row 3 starts from "
                     "a compacted context").startswith(" " * 8)
    assert line_with("compaction 5 (by the context budget, drop_oldest): row 5 starts").\
        startswith(" " * 4)
    answer = rollout.threads[1].answer  # thread 1.1
    assert re.fullmatch(r"b\d+", answer)
    assert line_with(f"↳ returned to 1: {answer}").startswith(" " * 8)
    assert line_with(f"↳ returned to main: {answer}").startswith(" " * 4)
    assert line_with("↳ no answer for 1.1 (depth_limit)").startswith(" " * 12)
    assert line_with("↳ no answer for 2 (count_limit)").startswith(" " * 8)


def test_the_view_page_carries_the_tree(tmp_path) -> None:
    _, record = tree_record(tmp_path)
    page = render_page("tree", [], [], [record])
    data = script_json({"rollouts": [record]})
    assert data in page
    assert '"thread_id":"1.1","parent":"1","depth":2' in data
    assert '"thread":"1.1"' in data  # each row names its thread
    script = page.split("<script>")[-1]
    assert "function threadBlocks(r)" in script and "thread-answer" in script

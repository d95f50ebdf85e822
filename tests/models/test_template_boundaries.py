"""A chat template that does not only append: each turn it re-renders becomes a row
boundary of the same rollout (cause ``template``), never a crash and never a drift."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.model import build_tiny_checkpoint, load_tokenizer
from agentrl.model.chat_template import QWEN25_CHAT_TEMPLATE
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from tests.models.rows import assert_rows_hold_engine_tokens
from tests.rollout.stand_ins import LongEnv, RecordingEngine, ScriptedEngine

SPEC = RolloutSpec("s0-g0-r0", "s0-g0", "long", task_seed=7, sampling_seed=3)
TRIMMING = QWEN25_CHAT_TEMPLATE.replace("message.content + '<|im_end|>'",
                                        "message.content | trim + '<|im_end|>'")


@pytest.fixture(scope="module")
def trimming_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny checkpoint's tokenizer with a template that trims replies (as Llama 3's
    does)."""
    path = build_tiny_checkpoint(tmp_path_factory.mktemp("trim") / "ckpt", hidden_size=32,
                                 num_heads=4, num_kv_heads=2, vocab_size=400)
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert TRIMMING != config["chat_template"]
    config["chat_template"] = TRIMMING
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(Path(path))


def play(tokenizer, reply: str, compaction: CompactionConfig | None = None):
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda prompt, params: reply))
    rollout = asyncio.run(play_rollout(SPEC, LongEnv(horizon=3), engine, tokenizer,
                                       RolloutConfig(), compaction or CompactionConfig()))
    return rollout, engine


def test_a_reply_the_template_trims_starts_a_row_instead_of_stopping_the_run(
        trimming_tokenizer):
    rollout, engine = play(trimming_tokenizer, "probe it, win ")
    assert rollout.valid and rollout.reward == 1.0, rollout.stats.error
    assert assert_rows_hold_engine_tokens(rollout.segments, engine.prompts,
                                          engine.generations) == [1, 1, 1]
    assert [(c.cause, c.strategy, c.segment) for c in rollout.stats.compactions] == [
        ("template", "trimmed", 0), ("template", "trimmed", 1)]
    # the next row starts from the template's own rendering of the whole conversation
    second = rollout.segments[1]
    prompt = trimming_tokenizer.decode(second.token_ids[:second.num_prompt_tokens])
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "probe it, win<|im_end|>" in prompt and "win <|im_end|>" not in prompt


def test_a_reply_the_template_keeps_appends_in_one_row(trimming_tokenizer):
    rollout, engine = play(trimming_tokenizer, "probe it, win")
    assert rollout.valid and len(rollout.segments) == 1 and not rollout.stats.compactions
    assert_rows_hold_engine_tokens(rollout.segments, engine.prompts, engine.generations)


def test_template_rows_do_not_use_up_max_compactions(trimming_tokenizer):
    rollout, _ = play(trimming_tokenizer, "probe it, win ",
                      CompactionConfig(strategy="drop_oldest", max_context_tokens=4096,
                                       max_compactions=1))
    assert rollout.valid and not rollout.stats.truncated
    assert rollout.stats.num_compactions == 2

"""Compaction: rows start from exactly what the engine received; generated tokens are kept
whole across rows; a rollout counts once whatever its number of rows."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.advantage import rollout_advantages
from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.reassembler import to_rows
from agentrl.rollout.compaction import SUMMARY_REQUEST
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from tests.rollout.stand_ins import LongEnv, RecordingEngine, ScriptedEngine

ROLLOUT = RolloutConfig(max_turns=20, max_new_tokens=16)


def play(engine, env, tokenizer, compaction, rollout_id="s0-g0-r0"):
    spec = RolloutSpec(rollout_id, "s0-g0", "long", task_seed=5, sampling_seed=1)
    return asyncio.run(play_rollout(spec, env, engine, tokenizer, ROLLOUT, compaction))


def policy(tokenizer):
    """Probe until told to summarize; then write a summary."""
    def reply(prompt, params):
        last_turn = tokenizer.decode(prompt).rsplit("<|im_start|>user", 1)[-1]
        if SUMMARY_REQUEST in last_turn:
            return "SUMMARY: probed a lot"
        return "probe win"
    return reply


def split_calls(rollout, prompts):
    """Which row each engine call belongs to. Calls come in order and a context only grows
    within a row, so a call starts the next row when it is not a longer prefix of this one."""
    owners: list[int] = []
    index, last_len = 0, -1
    for prompt in prompts:
        while not (rollout.segments[index].token_ids[: len(prompt)] == prompt
                   and len(prompt) > last_len):
            index, last_len = index + 1, -1
            assert index < len(rollout.segments), "an engine prompt matches no row"
        owners.append(index)
        last_len = len(prompt)
    return owners


@pytest.mark.parametrize("strategy", ["drop_oldest", "summarize"])
@pytest.mark.parametrize("budget", [440, 560, 100_000])
def test_rows_hold_exactly_what_the_engine_saw(tokenizer, strategy, budget):
    engine = RecordingEngine(ScriptedEngine(tokenizer, policy(tokenizer)))
    compaction = CompactionConfig(strategy=strategy, max_context_tokens=budget,
                                  keep_last_turns=1, max_compactions=50)
    rollout = play(engine, LongEnv(horizon=8, obs_len=30), tokenizer, compaction)
    assert rollout.valid and rollout.reward == 1.0
    assert len(rollout.segments) == rollout.stats.num_compactions + 1
    if budget == 100_000:
        assert len(rollout.segments) == 1
    else:
        assert len(rollout.segments) >= 2
    owners = split_calls(rollout, engine.prompts)
    assert owners == sorted(owners) and set(owners) == set(range(len(rollout.segments)))
    for index, segment in enumerate(rollout.segments):
        first_prompt = engine.prompts[owners.index(index)]
        # the row's prompt is byte for byte the first prompt the engine got for it
        assert segment.token_ids[: segment.num_prompt_tokens] == first_prompt
        assert sum(segment.loss_mask[: segment.num_prompt_tokens]) == 0
    generated = [t for s in rollout.segments
                 for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    assert generated == [t for g in engine.generations for t in g.token_ids]
    assert rollout.num_generated_tokens == rollout.stats.num_generated_tokens


def test_drop_oldest_leaves_a_marker_and_keeps_the_task(tokenizer):
    engine = RecordingEngine(ScriptedEngine(tokenizer, policy(tokenizer)))
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=440,
                                  keep_last_turns=1, max_compactions=50)
    rollout = play(engine, LongEnv(horizon=8, obs_len=30), tokenizer, compaction)
    later = tokenizer.decode(rollout.segments[-1].token_ids)
    assert "Task 5: probe 8 times." in later and "earlier turn(s) were removed" in later
    assert "probe 1 of task 5" not in later  # the oldest observation is gone


def test_summary_is_trained_in_the_row_that_produced_it(tokenizer):
    engine = RecordingEngine(ScriptedEngine(tokenizer, policy(tokenizer)))
    compaction = CompactionConfig(strategy="summarize", max_context_tokens=440,
                                  keep_last_turns=0, max_compactions=50)
    rollout = play(engine, LongEnv(horizon=8, obs_len=30), tokenizer, compaction)
    first, second = rollout.segments[0], rollout.segments[1]
    summary_ids = tokenizer.encode("SUMMARY: probed a lot") + [tokenizer.eos_token_id]
    tail = first.token_ids[-len(summary_ids):]
    assert tail == summary_ids and all(first.loss_mask[-len(summary_ids):])
    prompt = tokenizer.decode(second.token_ids[: second.num_prompt_tokens])
    assert "Summary of your earlier progress:\nSUMMARY: probed a lot" in prompt
    assert SUMMARY_REQUEST in tokenizer.decode(first.token_ids)


def test_a_replica_lost_during_the_summary_invalidates_only_that_rollout(tokenizer):
    from agentrl.engines.http import ReplicaUnavailableError

    scripted = ScriptedEngine(tokenizer, policy(tokenizer))

    class LostAtSummary:
        weight_version = 0

        async def generate(self, prompt_ids, params, key=None):
            if SUMMARY_REQUEST in tokenizer.decode(prompt_ids):
                raise ReplicaUnavailableError("http://10.0.0.2:8000 unreachable: reset")
            return await scripted.generate(prompt_ids, params, key)

    compaction = CompactionConfig(strategy="summarize", max_context_tokens=440,
                                  keep_last_turns=0, max_compactions=50)
    rollout = play(LostAtSummary(), LongEnv(horizon=8, obs_len=30), tokenizer, compaction)
    assert not rollout.valid and rollout.stats.error_kind == "engine_unavailable"
    assert "http://10.0.0.2:8000" in rollout.stats.error


def test_compaction_cap_ends_the_rollout_truncated(tokenizer):
    engine = ScriptedEngine(tokenizer, policy(tokenizer))
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=440,
                                  keep_last_turns=1, max_compactions=1)
    rollout = play(engine, LongEnv(horizon=30, obs_len=30), tokenizer, compaction)
    assert rollout.stats.truncated and rollout.stats.num_compactions == 1
    assert len(rollout.segments) == 2 and rollout.valid


def test_a_rollout_counts_once_whatever_its_rows(tokenizer):
    """Group {long rollout: reward 1 in k rows, short one: reward 0 in 1 row} → ±0.5."""
    results = {}
    for budget in (440, 560, 100_000):
        compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=budget,
                                      keep_last_turns=1, max_compactions=50)
        engine = ScriptedEngine(tokenizer, policy(tokenizer))
        win = play(engine, LongEnv(horizon=8, obs_len=30), tokenizer, compaction, "s0-g0-r0")
        lose = play(engine, LongEnv(horizon=1, reward=0.0), tokenizer, compaction, "s0-g0-r1")
        rows = to_rows([win, lose])
        per_rollout = rollout_advantages(rows, "grpo")
        results[budget] = (len(rows), per_rollout["s0-g0-r0"].advantage,
                           per_rollout["s0-g0-r1"].advantage)
    assert len({n for n, _, _ in results.values()}) == 3  # the row counts differ
    for _, adv_win, adv_lose in results.values():
        assert adv_win == pytest.approx(0.5) and adv_lose == pytest.approx(-0.5)


@pytest.mark.parametrize("strategy", ["drop_oldest", "summarize"])
def test_no_compaction_when_no_turn_follows_and_no_row_without_a_generated_token(
        tokenizer, strategy):
    """Whatever turn the rollout ends on (max_turns, or max_rollout_tokens), a compaction
    is made only for a turn that follows: no row is all prompt, no compaction (and, under
    summarize, no summary) is counted that nothing used."""
    import msgspec

    compaction = CompactionConfig(strategy=strategy, max_context_tokens=440,
                                  keep_last_turns=1, max_compactions=50)
    # max_turns 2 ends on an overflow: before, a row of the compacted context alone
    limits = [{"max_turns": n} for n in range(1, 9)] + [
        {"max_rollout_tokens": n} for n in range(4, 40, 3)]
    for limit in limits:
        engine = RecordingEngine(ScriptedEngine(tokenizer, policy(tokenizer)))
        spec = RolloutSpec("s0-g0-r0", "s0-g0", "long", task_seed=5, sampling_seed=1)
        rollout = asyncio.run(play_rollout(spec, LongEnv(horizon=20, obs_len=30), engine,
                                           tokenizer, msgspec.structs.replace(ROLLOUT, **limit),
                                           compaction))
        assert rollout.valid and rollout.stats.truncated, limit
        assert all(s.num_generated_tokens > 0 for s in rollout.segments), limit
        assert len(rollout.segments) == rollout.stats.num_compactions + 1, limit
        assert len(rollout.stats.compactions) == rollout.stats.num_compactions
        summaries = sum(SUMMARY_REQUEST in tokenizer.decode(p).rsplit("<|im_start|>user", 1)[-1]
                        for p in engine.prompts)
        expected = rollout.stats.num_compactions if strategy == "summarize" else 0
        if "max_turns" in limit:
            assert summaries == expected, limit  # no summary asked for on the last turn
        else:  # a summary may use the last tokens: then it is in its row, uncounted
            assert expected <= summaries <= expected + (strategy == "summarize"), limit
        assert rollout.num_generated_tokens == sum(len(g.token_ids) for g in engine.generations)

"""Compaction the policy decides (strategy "tool"): a ``compact`` call ends the row and
the rollout continues from the head plus its summary; the budget still forces the
fallback; every invariant holds over all rows."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.advantage import compute_advantages, rollout_advantages
from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.envs.tools import format_call
from agentrl.packing import collate
from agentrl.reassembler import to_rows
from agentrl.rollout.compact_tool import COMPACT_TOOL, find_compact_call
from agentrl.rollout.compaction import SUMMARY_PREFIX, SUMMARY_REQUEST
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.types import Message, Rollout
from tests.rollout.stand_ins import LongEnv, RecordingEngine, ScriptedEngine

ROLLOUT = RolloutConfig(max_turns=20, max_new_tokens=128, max_rollout_tokens=4000)


class FactEnv(LongEnv):
    """LongEnv whose probes reveal facts: probe k shows ``fact-k``; the answer needs all."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.actions: list[str] = []

    def step(self, action: str):
        self.actions.append(action)
        observation, reward, done, truncated, info = super().step(action)
        if observation:
            observation = [Message("tool", f"fact-{self.turn} " + observation[0].content,
                                   name="probe")]
        return observation, reward, done, truncated, info

    def needed_facts(self) -> list[str]:
        return [f"fact-{k}" for k in range(1, self.horizon)]


def compact_call(summary: str) -> str:
    return format_call(COMPACT_TOOL, summary=summary)


def play(engine, env, tokenizer, compaction, rollout_id="s0-g0-r0"):
    spec = RolloutSpec(rollout_id, "s0-g0", "long", task_seed=5, sampling_seed=1)
    return asyncio.run(play_rollout(spec, env, engine, tokenizer, ROLLOUT, compaction))


def scripted(tokenizer, plan: list[str]):
    """The replies in order; a summary request is answered "SUMMARY-BY-BUDGET"."""
    replies = iter(plan)

    def reply(prompt, params):
        if SUMMARY_REQUEST in tokenizer.decode(prompt[-400:]):
            return "SUMMARY-BY-BUDGET"
        return next(replies)
    return reply


def test_two_compactions_by_tool_and_one_by_budget_worked_by_hand(tokenizer):
    """probe, compact(A), probe, compact(B), probe, probe (the budget forces a summary
    here), the winning probe: 4 rows, the compactions recorded as tool, tool, budget."""
    plan = ["probe", compact_call("A: saw fact-1"), "probe", compact_call("B: fact-1 fact-2"),
            "probe", "probe", "probe win"]
    # measured without a budget: row 2's context after probe 3's and after probe 4's result
    free = RecordingEngine(ScriptedEngine(tokenizer, scripted(tokenizer, plan)))
    play(free, FactEnv(horizon=5, obs_len=30), tokenizer,
         CompactionConfig(strategy="tool", max_context_tokens=100_000, keep_last_turns=0))
    after_probe3, after_probe4 = len(free.prompts[5]), len(free.prompts[6])
    env = FactEnv(horizon=5, obs_len=30)
    engine = RecordingEngine(ScriptedEngine(tokenizer, scripted(tokenizer, plan)))
    compaction = CompactionConfig(strategy="tool", fallback="summarize", keep_last_turns=0,
                                  max_context_tokens=(after_probe3 + after_probe4) // 2,
                                  max_compactions=5)
    rollout = play(engine, env, tokenizer, compaction)

    assert rollout.valid and rollout.reward == 1.0 and not rollout.stats.truncated
    causes = [(c.cause, c.strategy, c.summary) for c in rollout.stats.compactions]
    assert causes == [("tool", "tool", "A: saw fact-1"), ("tool", "tool", "B: fact-1 fact-2"),
                      ("budget", "summarize", "SUMMARY-BY-BUDGET")]
    assert rollout.stats.num_compactions == 3 and len(rollout.segments) == 4
    # the environment saw its own actions only: never a compact call
    assert env.actions == ["probe", "probe", "probe", "probe", "probe win"]
    # every row starts from exactly what the engine received next
    for segment in rollout.segments:
        prompt = segment.token_ids[: segment.num_prompt_tokens]
        assert prompt in engine.prompts
    row1 = tokenizer.decode(rollout.segments[1].token_ids)
    assert f"{SUMMARY_PREFIX}A: saw fact-1" in row1 and "probe 1 of task" not in row1
    # the compact calls are generated tokens of the row they end, trained there
    for index, summary in ((0, "A: saw fact-1"), (1, "B: fact-1 fact-2")):
        seg = rollout.segments[index]
        generated = [t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
        assert summary in tokenizer.decode(generated)
        assert find_compact_call(tokenizer.decode(generated)) is not None
    # the facts: kept by summary A (fact-1), by B (fact-1, fact-2); the budget's summary
    # holds none of them, but the newest turn it kept shows fact-4 (fact-3's is dropped)
    kept = [(c.facts_revealed, c.facts_kept) for c in rollout.stats.compactions]
    assert kept == [(["fact-1"], ["fact-1"]), (["fact-1", "fact-2"], ["fact-1", "fact-2"]),
                    (["fact-1", "fact-2", "fact-3", "fact-4"], ["fact-4"])]
    assert rollout.stats.needed_facts == ["fact-1", "fact-2", "fact-3", "fact-4"]

    # invariants over the rows: one reward copy each, one advantage, 1/N over all tokens
    other = Rollout("s0-g0-r1", "s0-g0", "long", [rollout.segments[0]], 0.0)
    rows = to_rows([rollout, other])
    assert [r.reward for r in rows] == [1.0, 1.0, 1.0, 1.0, 0.0]
    per_rollout = rollout_advantages(rows)
    assert per_rollout["s0-g0-r0"].advantage == pytest.approx(0.5)  # mean of {1, 0}
    assert per_rollout["s0-g0-r1"].advantage == pytest.approx(-0.5)
    advantages = compute_advantages(rows)
    batch = collate(rows, advantages, list(range(len(rows))))
    generated = sum(r.num_generated_tokens for r in rows)
    assert batch.num_tokens == generated  # N counts the compact calls and summaries too
    on = batch.loss_mask[0] > 0
    first_rollout_tokens = sum(len(r.token_ids) for r in rows[:4])
    assert set(batch.advantages[0, :first_rollout_tokens][on[:first_rollout_tokens]].tolist()) \
        == {0.5}


def test_a_compact_call_without_a_summary_is_answered_and_compacts_nothing(tokenizer):
    env = FactEnv(horizon=2, obs_len=5)
    bad = format_call(COMPACT_TOOL, note="no summary")
    plan = ["probe", bad, compact_call("ok") + "\n" + format_call("probe"), "probe win"]
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, plan))
    compaction = CompactionConfig(strategy="tool", max_context_tokens=4000)
    rollout = play(engine, env, tokenizer, compaction)
    assert rollout.stats.tool_errors == {"invalid_arguments": 1, "compact_not_alone": 1}
    assert [c.cause for c in rollout.stats.compactions] == ["tool"]
    text = tokenizer.decode(rollout.segments[0].token_ids)
    assert 'compact needs a non-empty string argument "summary"' in text
    assert env.actions == ["probe", "probe win"] and rollout.reward == 1.0


def test_an_unusable_compact_call_is_answered_under_the_budget(tokenizer):
    """The error answer to a bad compact call is an observation like any other: past the
    budget it compacts first (the fallback), so no prompt the engine gets passes it."""
    env = FactEnv(horizon=6, obs_len=30)
    bad = format_call(COMPACT_TOOL, note="no summary")
    engine = RecordingEngine(ScriptedEngine(tokenizer, scripted(
        tokenizer, ["probe", bad, bad, bad, bad, "probe", "probe", "probe", "probe",
                    "probe win"])))
    budget = 750  # the first prompt is ~510 tokens with this tokenizer
    compaction = CompactionConfig(strategy="tool", fallback="drop_oldest",
                                  max_context_tokens=budget, keep_last_turns=0,
                                  max_compactions=20)
    rollout = play(engine, env, tokenizer, compaction)
    assert rollout.stats.tool_errors["invalid_arguments"] == 4
    assert "budget" in {c.cause for c in rollout.stats.compactions}
    assert max(len(p) for p in engine.prompts) <= budget
    assert rollout.valid and rollout.reward == 1.0


def test_compactions_by_tool_count_against_max_compactions(tokenizer):
    env = FactEnv(horizon=8, obs_len=5)
    plan = [compact_call("s")] * 4
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, plan))
    compaction = CompactionConfig(strategy="tool", max_context_tokens=4000, max_compactions=2)
    rollout = play(engine, env, tokenizer, compaction)
    assert rollout.stats.truncation_reason == "max_compactions"
    assert rollout.stats.num_compactions == 2 and len(rollout.segments) == 3


def test_keep_last_turns_keeps_the_turns_before_the_call(tokenizer):
    env = FactEnv(horizon=4, obs_len=5)
    plan = ["probe", "probe", compact_call("two probes"), "probe", "probe win"]
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, plan))
    compaction = CompactionConfig(strategy="tool", max_context_tokens=4000, keep_last_turns=1)
    rollout = play(engine, env, tokenizer, compaction)
    row1 = tokenizer.decode(rollout.segments[1].token_ids)
    assert "fact-2" in row1 and "fact-1" not in row1
    compaction_record = rollout.stats.compactions[0]
    assert compaction_record.facts_revealed == ["fact-1", "fact-2"]
    assert compaction_record.facts_kept == ["fact-2"]


def test_the_compact_tool_is_offered_and_an_env_tool_of_that_name_is_refused(tokenizer):
    env = FactEnv(horizon=1, obs_len=5)
    engine = RecordingEngine(ScriptedEngine(tokenizer, scripted(tokenizer, ["probe win"])))
    play(engine, env, tokenizer, CompactionConfig(strategy="tool"))
    assert '"name": "compact"' in tokenizer.decode(engine.prompts[0])

    class Clash(FactEnv):
        def tool_schemas(self):
            return [{"type": "function", "function": {"name": COMPACT_TOOL, "parameters": {}}}]

    rollout = play(ScriptedEngine(tokenizer, scripted(tokenizer, ["x"])), Clash(horizon=2),
                   tokenizer, CompactionConfig(strategy="tool"))
    assert not rollout.valid and rollout.stats.error_kind == "bad_tool_schemas"
    assert 'has a tool named "compact"' in rollout.stats.error


def test_truncate_ends_the_rollout_at_the_budget(tokenizer):
    env = FactEnv(horizon=10, obs_len=40)
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, ["probe"] * 10))
    rollout = play(engine, env, tokenizer, CompactionConfig(strategy="truncate",
                                                            max_context_tokens=300))
    assert rollout.stats.truncation_reason == "context_budget"
    assert len(rollout.segments) == 1 and rollout.stats.num_compactions == 0
    assert len(rollout.segments[0].token_ids) <= 300 + ROLLOUT.max_new_tokens


def test_a_summary_request_always_fits_the_engine(tokenizer):
    """engine_max_len leaves room for the summary request and the summary whenever the
    budget asks for one; the request is within that room even byte by byte."""
    from agentrl.config import config_from_dict
    from agentrl.engines.build import SUMMARY_REQUEST_TOKENS, engine_max_len
    from agentrl.rollout.context import ChatContext

    ctx = ChatContext(tokenizer, None, [{"role": "user", "content": "x"}])
    _, ids = ctx.turn_delta(tokenizer.encode("reply") + [tokenizer.eos_token_id],
                            (tokenizer.eos_token_id,),
                            [{"role": "user", "content": SUMMARY_REQUEST}])
    assert len(ids) <= SUMMARY_REQUEST_TOKENS  # this tokenizer is almost byte-level

    def max_len(**compaction):
        config = config_from_dict({"environments": [{"id": "agentrl/Countdown-v0"}],
                                   "compaction": {"max_context_tokens": 300, **compaction}})
        return engine_max_len(config, 100_000)

    plain = 300 + RolloutConfig().max_new_tokens + 1
    assert max_len(strategy="drop_oldest") == plain
    assert max_len(strategy="tool", fallback="drop_oldest") == plain
    room = plain + SUMMARY_REQUEST_TOKENS + 50
    assert max_len(strategy="summarize", summary_max_tokens=50) == room
    assert max_len(strategy="tool", fallback="summarize", summary_max_tokens=50) == room


def test_a_compact_call_on_the_last_turn_leaves_no_dead_row(tokenizer):
    """The policy's last turn is a ``compact`` call: nothing reads the compacted context,
    so no all-prompt row is trained and no compaction is counted (the call itself, and
    its summary, stay generated tokens of the row that made it)."""
    import msgspec

    env = FactEnv(horizon=8, obs_len=5)
    plan = ["probe", compact_call("one probe"), "probe", compact_call("two probes")]
    engine = ScriptedEngine(tokenizer, scripted(tokenizer, plan))
    compaction = CompactionConfig(strategy="tool", max_context_tokens=4000)
    spec = RolloutSpec("s0-g0-r0", "s0-g0", "long", task_seed=5, sampling_seed=1)
    rollout = asyncio.run(play_rollout(spec, env, engine, tokenizer,
                                       msgspec.structs.replace(ROLLOUT, max_turns=4),
                                       compaction))
    assert rollout.stats.truncation_reason == "max_turns"
    assert [s.num_generated_tokens > 0 for s in rollout.segments] == [True, True]
    assert rollout.stats.num_compactions == 1 and len(rollout.stats.compactions) == 1
    assert "two probes" in tokenizer.decode(rollout.segments[-1].token_ids)

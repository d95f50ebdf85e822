"""One rollout: token-in/token-out context building, rewards, stats, failures, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from tests.rollout.stand_ins import LongEnv, RecordingEngine, ScriptedEngine

SPEC = RolloutSpec("s0-g0-r0", "s0-g0", "long", task_seed=7, sampling_seed=3)


def play(engine, env, tokenizer, rollout=None, compaction=None, spec=SPEC):
    return asyncio.run(play_rollout(spec, env, engine, tokenizer, rollout or RolloutConfig(),
                                    compaction or CompactionConfig()))


def fixed(text):
    return lambda prompt, params: text


def test_context_is_the_template_rendering_grown_by_appending(tokenizer):
    engine = RecordingEngine(ScriptedEngine(tokenizer, fixed("probe it, win")))
    env = LongEnv(horizon=3)
    rollout = play(engine, env, tokenizer)
    assert rollout.valid and rollout.reward == 1.0 and len(rollout.segments) == 1
    seg = rollout.segments[0]
    # every prompt the engine received is a prefix of the segment: nothing re-encoded
    for prompt in engine.prompts:
        assert seg.token_ids[: len(prompt)] == prompt
    # the last prompt decodes to exactly the template's rendering of the conversation
    text = tokenizer.decode(engine.prompts[-1])
    expected = render_conversation(tokenizer, env, 2, "probe it, win")
    assert text == expected
    assert text.count("<|im_end|>") == expected.count("<|im_end|>")  # never doubled


def render_conversation(tokenizer, env, turns, reply):
    """Reference: the template over the whole conversation, rendered at once."""
    probe = LongEnv(horizon=env.horizon)
    messages = [{"role": m.role, "content": m.content} for m in probe.reset(seed=7)[0]]
    for _ in range(turns):
        messages.append({"role": "assistant", "content": reply})
        obs = probe.step(reply)[0]
        messages.extend({"role": m.role, "content": m.content, "name": m.name} for m in obs)
    return tokenizer.apply_chat_template(messages, tools=env.tool_schemas(),
                                         add_generation_prompt=True)


def test_generated_tokens_logprobs_and_masks_follow_the_engine(tokenizer):
    engine = RecordingEngine(ScriptedEngine(tokenizer, fixed("go")))
    rollout = play(engine, LongEnv(horizon=3), tokenizer)
    seg = rollout.segments[0]
    generated = [t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
    assert generated == [t for g in engine.generations for t in g.token_ids]
    logprobs = [lp for lp, m in zip(seg.logprobs, seg.loss_mask, strict=True) if m]
    assert logprobs == [lp for g in engine.generations for lp in g.logprobs]
    assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask, strict=True) if not m)
    assert rollout.stats.num_turns == 3
    assert rollout.stats.num_generated_tokens == len(generated) == rollout.num_generated_tokens


def test_reward_is_scaled_sum_and_stats_count_tool_errors(tokenizer):
    engine = ScriptedEngine(tokenizer, fixed("bad win"))
    spec = RolloutSpec("r", "g", "long", task_seed=1, reward_scale=2.5)
    rollout = play(engine, LongEnv(horizon=3), tokenizer, spec=spec)
    assert rollout.reward == 2.5
    assert rollout.stats.tool_errors == {"timeout": 3}
    assert rollout.reward_components == {"win": 1.0}
    assert not rollout.stats.truncated


def test_max_turns_and_token_budget_truncate(tokenizer):
    engine = ScriptedEngine(tokenizer, fixed("hello world"))
    rollout = play(engine, LongEnv(horizon=10), tokenizer, RolloutConfig(max_turns=2))
    assert rollout.stats.truncated and rollout.stats.num_turns == 2 and rollout.valid
    per_turn = len(tokenizer.encode("hello world")) + 1
    config = RolloutConfig(max_rollout_tokens=per_turn * 2 + 1)
    rollout = play(engine, LongEnv(horizon=10), tokenizer, config)
    assert rollout.stats.truncated and rollout.num_generated_tokens == per_turn * 2 + 1


def test_env_crash_and_timeouts_invalidate_only_that_rollout(tokenizer):
    engine = ScriptedEngine(tokenizer, fixed("go"))
    crashed = play(engine, LongEnv(horizon=5, fail_at=2), tokenizer)
    assert not crashed.valid and "RuntimeError: tool crashed" in crashed.stats.error
    assert crashed.stats.num_turns == 2 and crashed.segments  # partial trace kept
    slow = play(engine, LongEnv(delay_s=0.3), tokenizer, RolloutConfig(step_timeout_s=0.05))
    assert not slow.valid and "timed out" in slow.stats.error
    slow_rollout = play(engine, LongEnv(horizon=20, delay_s=0.05), tokenizer,
                        RolloutConfig(rollout_timeout_s=0.2, max_turns=20))
    assert not slow_rollout.valid and "rollout timed out" in slow_rollout.stats.error


@pytest.mark.parametrize("max_new_tokens", [1, 3])
def test_length_cut_reply_gets_the_template_closing(tokenizer, max_new_tokens):
    engine = RecordingEngine(ScriptedEngine(tokenizer, fixed("a much longer reply text")))
    play(engine, LongEnv(horizon=2), tokenizer, RolloutConfig(max_new_tokens=max_new_tokens))
    first, second = engine.prompts
    cut = engine.generations[0].token_ids
    assert cut[-1] != tokenizer.eos_token_id  # cut by length: the delta must close the turn
    delta = tokenizer.decode(second[len(first) + len(cut):])
    assert delta.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")

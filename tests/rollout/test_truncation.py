"""Compaction keeps the newest tool result; every truncation has a named reason, counted
per environment; the turn limits' precedence; per-step rewards add up."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.observe.metrics import rollout_figures
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from environments.kvstore import KVStoreEnv
from tests.factories import rollout
from tests.rollout.stand_ins import LongEnv, RecordingEngine, ScriptedEngine

SPEC = RolloutSpec("s0-g0-r0", "s0-g0", "kv", task_seed=3, sampling_seed=1)


def solve(env, tokenizer, rollout_config=None, compaction=None, spec=SPEC):
    """Play one rollout of ``env`` with its own scripted solver standing in for the model."""
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda p, s: env.demonstrate(env.history)))
    result = asyncio.run(play_rollout(spec, env, engine, tokenizer,
                                      rollout_config or RolloutConfig(max_new_tokens=64),
                                      compaction or CompactionConfig()))
    return result, engine


def newest_tool_results(env) -> list[str]:
    """The content of the newest tool message before each assistant turn."""
    out, last = [], None
    for message in env.history:
        if message.role == "assistant":
            out.append(last)
        elif message.role == "tool":
            last = message.content
    return out


@pytest.mark.parametrize("keep_last_turns", [0, 1])
def test_compaction_never_drops_the_tool_result_holding_the_answer(tokenizer, keep_last_turns):
    # a lookup chain: each step's key and the final value arrive only in the newest tool
    # result. The budget fits the task and one turn, never two: every turn compacts.
    env = KVStoreEnv(chain_length=4, padding_words=6)
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=760,
                                  keep_last_turns=keep_last_turns, max_compactions=10)
    result, engine = solve(env, tokenizer, compaction=compaction)
    assert result.reward == 1.0 and result.valid and not result.stats.truncated
    assert result.stats.num_compactions >= 3  # after each lookup but the first
    for prompt, newest in zip(engine.prompts, newest_tool_results(env), strict=True):
        if newest is not None:  # the engine saw the newest result whenever it acted
            assert newest.split("\n")[0] in tokenizer.decode(prompt)


def test_without_room_for_the_newest_turn_the_rollout_ends_named(tokenizer):
    # the task fits, the task + marker + newest turn does not: end, do not continue blind
    env = KVStoreEnv(chain_length=4, padding_words=60)
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=760,
                                  keep_last_turns=1, max_compactions=10)
    result, engine = solve(env, tokenizer, compaction=compaction)
    assert result.stats.truncated and result.stats.truncation_reason == "context_budget"
    assert result.reward == 0.0 and result.stats.num_compactions == 0
    assert len(engine.prompts) == 1  # no turn was played without the newest result


def test_the_smaller_turn_limit_wins_and_is_named(tokenizer):
    # the environment's max_turns (2) before rollout.max_turns (5): reason "env"
    result, _ = solve(KVStoreEnv(chain_length=6, padding_words=2, max_turns=2), tokenizer,
                      RolloutConfig(max_new_tokens=64, max_turns=5))
    assert result.stats.num_turns == 2 and result.stats.truncation_reason == "env"
    # rollout.max_turns (3) before the environment's (8): reason "max_turns"
    result, _ = solve(KVStoreEnv(chain_length=6, padding_words=2, max_turns=8), tokenizer,
                      RolloutConfig(max_new_tokens=64, max_turns=3))
    assert result.stats.num_turns == 3 and result.stats.truncation_reason == "max_turns"
    # a finished episode is not truncated
    result, _ = solve(KVStoreEnv(chain_length=2, padding_words=2), tokenizer)
    assert result.reward == 1.0 and result.stats.truncation_reason is None


def test_token_and_compaction_limits_are_named(tokenizer):
    # each lookup call is 32 tokens: 40 generated tokens end the rollout by its 3rd turn
    result, _ = solve(KVStoreEnv(chain_length=6, padding_words=2), tokenizer,
                      RolloutConfig(max_new_tokens=64, max_rollout_tokens=40))
    assert result.stats.truncation_reason == "max_rollout_tokens"
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=760,
                                  keep_last_turns=1, max_compactions=1)
    result, _ = solve(KVStoreEnv(chain_length=6, padding_words=6), tokenizer,
                      compaction=compaction)
    assert result.stats.truncation_reason == "max_compactions"
    assert result.stats.num_compactions == 1


def test_truncations_are_counted_by_reason_overall_and_per_environment():
    def truncated(rid, env, reason):
        r = rollout(rid, "g", 0.0, env=env)
        r.stats.truncated, r.stats.truncation_reason = reason is not None, reason
        return r

    rollouts = [truncated("a", "x", "context_budget"), truncated("b", "x", "context_budget"),
                truncated("c", "x", None), truncated("d", "y", "env")]
    total = rollout_figures(rollouts)
    assert total["truncated/context_budget"] == 2 and total["truncated/env"] == 1
    assert total["truncated/max_turns"] == 0 and total["truncation_rate"] == 0.75
    per_x = rollout_figures(rollouts[:3], "env/x/")
    assert per_x["env/x/truncated/context_budget"] == 2 and per_x["env/x/truncated/env"] == 0


class ShapedKVStore(KVStoreEnv):
    """Per-step reward: 0.1 for every lookup that returned a value, on top of the grade."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        found = sum(1 for m in observation if m.role == "tool" and m.name == "lookup"
                    and not m.content.startswith("Error"))
        return observation, reward + 0.1 * found, terminated, truncated, info


def test_the_rollout_reward_is_the_sum_of_step_rewards_times_the_scale(tokenizer):
    spec = RolloutSpec("s0-g0-r0", "s0-g0", "kv", task_seed=3, sampling_seed=1, reward_scale=2.0)
    result, _ = solve(ShapedKVStore(chain_length=3, padding_words=2), tokenizer, spec=spec)
    # 3 lookups at 0.1 each, then the correct answer's 1.0; times reward_scale 2
    assert result.reward == pytest.approx(2.0 * (3 * 0.1 + 1.0))


def test_the_stand_in_env_still_compacts_without_truncation(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda p, s: "probe win")
    compaction = CompactionConfig(strategy="drop_oldest", max_context_tokens=440,
                                  keep_last_turns=1, max_compactions=50)
    result = asyncio.run(play_rollout(SPEC, LongEnv(horizon=8, obs_len=30), engine, tokenizer,
                                      RolloutConfig(max_turns=20, max_new_tokens=16),
                                      compaction))
    assert result.reward == 1.0 and result.stats.truncation_reason is None
    assert result.stats.num_compactions == 6

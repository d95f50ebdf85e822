"""The failure taxonomy: infrastructure retried, policy-caused trained, ambiguous masked."""

from __future__ import annotations

import asyncio
import json
import warnings

import msgspec
import pytest

from agentrl.cli import main
from agentrl.config import config_from_dict
from agentrl.envs import AgentEnv, Task
from agentrl.observe.costs import length_figures
from agentrl.rollout.env_contract import FAILURE_CLASSES, INVALID_KINDS
from agentrl.rollout.episode import CURRENT_ROLLOUT
from agentrl.rollout.failures import (
    AMBIGUOUS,
    FAILURE_CLASS_NAMES,
    INFRASTRUCTURE,
    FailureRules,
    PersistentFailure,
    RetriesExhaustedWarning,
    failure_class,
    with_retries,
)
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Message
from tests.rollout.stand_ins import LongEnv, ScriptedEngine


def make_config(group_size: int = 4, **rollout):
    return config_from_dict({
        "environments": [{"id": "test:long", "name": "long"}],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": group_size,
                  "global_batch_size": 2 * group_size},
        "rollout": {"max_turns": 4, **rollout},
    })


def collect(tokenizer, config, factory, reply="win"):
    engine = ScriptedEngine(tokenizer, lambda prompt, params: reply)
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler({"long": 1.0}, 0),
                           make_env=factory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = asyncio.run(runner.collect(0, config.batch.global_batch_size))
    return result, caught


class FlakyReset(LongEnv):
    """Reset raises ConnectionError when ``broken(rollout_id, seed)`` says so."""

    def __init__(self, broken, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rollout_id = CURRENT_ROLLOUT.get().rollout_id
        self.broken = broken

    def reset(self, *, seed=None, options=None):
        if self.broken(self.rollout_id, seed):
            raise ConnectionError("env server at 127.0.0.1:9 refused the connection")
        return super().reset(seed=seed, options=options)


def test_every_failure_kind_has_a_class():
    assert set(FAILURE_CLASSES) == set(INVALID_KINDS)
    assert set(FAILURE_CLASSES.values()) <= set(FAILURE_CLASS_NAMES)
    for kind in ("reset_raised", "construct_raised", "env_unreachable", "env_server_full",
                 "env_disconnected", "worker_died", "engine_unavailable"):
        assert failure_class(kind, generated_tokens=5) == INFRASTRUCTURE
    assert failure_class("step_timeout", 5) == AMBIGUOUS
    assert failure_class("rollout_timeout", 5) == AMBIGUOUS
    assert failure_class("harness_budget", 5) == "policy"
    # before the policy generated a token, nothing can be its fault
    assert failure_class("step_timeout", 0) == INFRASTRUCTURE


def test_an_infrastructure_failure_is_retried_with_a_fresh_environment(tokenizer):
    built: list[FlakyReset] = []

    def factory(env_config):  # the first attempt of every rollout fails at reset
        built.append(FlakyReset(lambda rid, seed: "-retry" not in rid, horizon=1))
        return built[-1]

    result, caught = collect(tokenizer, make_config(), factory)
    assert len(result.rollouts) == 8 and all(r.valid for r in result.rollouts)
    for group in result.groups:
        assert len(group.rollouts) == 4  # the group stays full
        for j, rollout in enumerate(group.rollouts):
            assert rollout.rollout_id == f"{group.group_id}-r{j}-retry1"
            assert rollout.retry_of == f"{group.group_id}-r{j}"
            assert rollout.reward == 1.0
    seeds = {g.group_id: g.task_seed for g in result.groups}
    by_id = {e.rollout_id: e.seed for e in built if e.seed is not None}
    for rollout in result.rollouts:  # the retry played the same task
        assert by_id[rollout.rollout_id] == seeds[rollout.group_id]
    assert len(built) == 16 and all(e.closed for e in built if e.seed is not None)
    assert result.retried == {"long": {"reset_raised": 8}}
    assert result.invalid == {} and result.num_played == {"long": 8}
    assert not [w for w in caught if issubclass(w.category, RetriesExhaustedWarning)]


def test_a_task_that_always_breaks_its_server_is_named_and_masked(tokenizer):
    def factory(env_config):
        return FlakyReset(lambda rid, seed: True, horizon=1)

    result, caught = collect(tokenizer, make_config(max_retries=2), factory)
    assert all(not r.valid and r.stats.error_kind == "reset_raised" for r in result.rollouts)
    assert result.invalid == {"long": {"reset_raised": 8}}
    assert result.retried == {"long": {"reset_raised": 16}}  # 2 retries of each, then masked
    named = [str(w.message) for w in caught if issubclass(w.category, RetriesExhaustedWarning)]
    assert len(named) == 2  # once per task: its other rollouts are only counted
    seeds = sorted(g.task_seed for g in result.groups)
    assert sorted(int(text.split("task seed ")[1].split(":")[0]) for text in named) == seeds
    assert all(": all 3 attempts of rollout" in text for text in named)
    assert all(r.reward == 0.0 for r in result.rollouts)  # never a trained zero


def test_without_retries_an_infrastructure_failure_is_masked_at_once(tokenizer):
    def factory(env_config):
        return FlakyReset(lambda rid, seed: rid.endswith("r0"), horizon=1)

    result, _ = collect(tokenizer, make_config(max_retries=0), factory)
    assert result.invalid == {"long": {"reset_raised": 2}} and result.retried == {}


def test_an_ambiguous_failure_is_masked_unless_moved(tokenizer):
    def factory(env_config):
        return LongEnv(horizon=2, fail_at=1)  # the step after the policy's first turn

    masked, _ = collect(tokenizer, make_config(), factory)
    assert masked.invalid == {"long": {"step_raised": 8}} and masked.retried == {}
    retried, _ = collect(tokenizer, make_config(ambiguous_failures="retry"), factory)
    assert retried.retried == {"long": {"step_raised": 16}}
    assert retried.invalid == {"long": {"step_raised": 8}}
    kept, _ = collect(tokenizer, make_config(ambiguous_failures="keep",
                                             failure_rewards={"step_raised": -0.5}), factory)
    assert all(r.valid and r.reward == -0.5 for r in kept.rollouts)
    assert kept.kept == {"long": {"step_raised": 8}} and kept.invalid == {}


def test_a_policy_caused_failure_is_trained_with_its_reward_or_a_penalty(tokenizer):
    def factory(env_config):
        return LongEnv(horizon=50)

    # a runaway: more tokens than the rollout may generate
    result, _ = collect(tokenizer, make_config(max_rollout_tokens=6, max_new_tokens=4),
                        factory, reply="win win win win")
    assert all(r.valid and r.stats.truncation_reason == "max_rollout_tokens"
               for r in result.rollouts)
    assert all(r.reward == 0.0 for r in result.rollouts)  # the environment's reward
    assert result.kept == {"long": {"max_rollout_tokens": 8}} and result.invalid == {}
    penalised, _ = collect(tokenizer, make_config(
        max_rollout_tokens=6, max_new_tokens=4,
        failure_rewards={"max_rollout_tokens": -1.0}), factory, reply="win win win win")
    assert all(r.valid and r.reward == -1.0 for r in penalised.rollouts)


def test_malformed_calls_past_the_limit_end_the_rollout_trained(tokenizer):
    def factory(env_config):
        return LongEnv(horizon=50)  # "bad" in an action counts one tool error

    result, _ = collect(tokenizer, make_config(max_tool_errors=1, max_turns=10), factory,
                        reply="bad call")
    for rollout in result.rollouts:
        assert rollout.valid and rollout.stats.truncation_reason == "tool_errors"
        assert rollout.stats.num_turns == 2  # the second error passed the limit of 1
    assert result.kept == {"long": {"tool_errors": 8}}


def test_failure_rewards_must_name_a_kind_that_can_be_kept():
    config = make_config()
    rollout = msgspec.structs.replace(config.rollout, failure_rewards={"reset_raised": -1.0})
    with pytest.raises(ValueError, match=r"rollout.failure_rewards names \['reset_raised'\]"):
        FailureRules(rollout)


def test_a_call_that_fails_now_and_then_is_retried_and_a_persistent_one_refused():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "prompt"

    value, failures = with_retries(flaky, attempts=3)
    assert value == "prompt" and len(failures) == 2
    with pytest.raises(PersistentFailure, match="failed all 3 of 3 attempts, the last with "
                                                "ConnectionError: down"):
        with_retries(lambda: (_ for _ in ()).throw(ConnectionError("down")), attempts=3)


class FlakyFileEnv(AgentEnv):
    """Drawing a task fails as often as the file ``counter`` says (decremented each time:
    the count must cross into check-env's worker process), then works."""

    def __init__(self, counter: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.counter = counter

    def sample_task(self, rng):
        with open(self.counter) as handle:
            left = int(handle.read())
        if left > 0:
            with open(self.counter, "w") as handle:
                handle.write(str(left - 1))
            raise ConnectionError("env server at 127.0.0.1:9 dropped the connection")
        return Task([Message("user", "Say hi.")], answer="hi", key=str(rng.integers(1000)))

    def grade(self, answer):
        return float(answer.strip() == "hi")

    def demonstrate(self, messages):
        return "hi"


def test_check_env_retries_a_reset_that_fails_now_and_then(tmp_path, capsys):
    counter = tmp_path / "failures"
    argv = ["check-env", "tests.rollout.test_failure_classes:FlakyFileEnv", "--kwargs",
            json.dumps({"counter": str(counter)})]
    counter.write_text("1")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "reset() failed (reset_raised)" in out and "retrying (attempt 2 of 3)" in out
    counter.write_text("3")  # a failure that persists is refused, saying how often
    assert main(argv) == 1
    assert "(it failed all 3 attempts; --retries 2)" in capsys.readouterr().out


def test_length_figures_compare_trained_with_every_rollout_generated(tokenizer):
    def factory(env_config):  # r0 of each group fails on every attempt, after the policy
        return LongEnv(horizon=2, fail_at=1 if "-r0" in CURRENT_ROLLOUT.get().rollout_id
                       else None)

    result, _ = collect(tokenizer, make_config(), factory)
    figures = length_figures(result.rollouts, result.costs)
    trained = [r.stats.spend.num_generated_tokens for r in result.rollouts if r.trainable]
    assert len(trained) == 6
    assert figures["length/trained_mean"] == figures["env/long/length/trained_mean"] == (
        sum(trained) / 6)
    played = result.costs["long"]
    assert played.num_rollouts == 8
    # the masked ones played one turn of the two: all rollouts generated are shorter
    assert figures["length/generated_mean"] == played.num_generated_tokens / 8
    assert figures["length/generated_mean"] < figures["length/trained_mean"]

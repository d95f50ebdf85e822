"""The group runner: ids, shared task seeds, concurrency, and dynamic sampling."""

from __future__ import annotations

import asyncio
import math
import random
import warnings

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.config import config_from_dict
from agentrl.observe.metrics import drop_reason
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Group, Rollout
from tests.rollout.stand_ins import LongEnv, ScriptedEngine


def make_config(filter_uniform=False, extra=2, envs=("long",), group_size=4,
                deterministic=False):
    return config_from_dict({
        "environments": [{"id": f"test:{name}", "name": name} for name in envs],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": group_size,
                  "global_batch_size": 2 * group_size},
        "rollout": {"filter_uniform_groups": filter_uniform, "max_extra_collections": extra,
                    "max_turns": 6},
        "train": {"deterministic": deterministic},
    })


def win_on_even_seed(tokenizer):
    """A policy whose reply depends on the rollout's sampling seed: rewards vary in a group."""
    return lambda prompt, params: "win" if params.seed % 2 == 0 else "lose"


def make_runner(tokenizer, config, env_factory, policy=None):
    engine = ScriptedEngine(tokenizer, policy or win_on_even_seed(tokenizer))
    names = [e.display_name() for e in config.environments]
    sampler = EnvironmentSampler({n: 1.0 for n in names}, seed=0)
    return RolloutRunner(config, engine, tokenizer, sampler, make_env=env_factory), engine


def test_groups_share_task_seed_and_have_explicit_ids(tokenizer):
    envs: list[LongEnv] = []

    def factory(env_config):
        envs.append(LongEnv(horizon=2))
        return envs[-1]

    runner, engine = make_runner(tokenizer, make_config(), factory)
    result = asyncio.run(runner.collect(step=3, num_rollouts_needed=8))
    assert sorted(g.group_id for g in result.groups) == ["s3-g0", "s3-g1"]
    for group in result.groups:
        assert [r.rollout_id for r in group.rollouts] == [
            f"{group.group_id}-r{j}" for j in range(4)]
        prompts = {tuple(r.segments[0].token_ids[: r.segments[0].num_prompt_tokens])
                   for r in group.rollouts}
        assert len(prompts) == 1  # one task per group
    assert len({e.seed for e in envs}) == 2 and len(envs) == 8
    assert all(e.closed for e in envs)
    assert len(result.rollouts) == 8 and result.dropped == {}


def test_rollouts_of_a_collection_run_concurrently(tokenizer):
    # 8 rollouts of 2 steps sleeping 0.1 s each: sequential would take >= 1.6 s
    runner, _ = make_runner(tokenizer, make_config(), lambda c: LongEnv(horizon=2,
                                                                         delay_s=0.1))
    loop = asyncio.new_event_loop()
    start = loop.time()
    loop.run_until_complete(runner.collect(0, 8))
    assert loop.time() - start < 1.0
    loop.close()


def test_a_runner_collects_under_one_event_loop_after_another(tokenizer):
    # more rollouts than rollout.max_concurrent_rollouts, so they wait on the limit;
    # each asyncio.run is a new loop, and the limit must not stay bound to the first
    config = make_config()
    config = msgspec.structs.replace(config, rollout=msgspec.structs.replace(
        config.rollout, max_concurrent_rollouts=3))
    runner, _ = make_runner(tokenizer, config, lambda c: LongEnv(horizon=2, delay_s=0.01))
    for step in range(3):
        result = asyncio.run(runner.collect(step, 8))
        assert len(result.rollouts) == 8 and all(r.valid for r in result.rollouts)


def test_a_failing_env_invalidates_rollouts_and_collection_goes_on(tokenizer):
    count = {"n": 0}

    def factory(env_config):
        count["n"] += 1
        return LongEnv(horizon=2, fail_at=1 if count["n"] % 4 == 1 else None)

    runner, _ = make_runner(tokenizer, make_config(), factory)
    result = asyncio.run(runner.collect(0, 8))
    invalid = [r for r in result.rollouts if not r.valid]
    assert len(invalid) == 2 and len(result.rollouts) == 8
    assert all("tool crashed" in r.stats.error for r in invalid)


def test_dynamic_sampling_drops_uniform_groups_and_refills_them(tokenizer):
    first_round: set[int] = set()

    def uniform(seed):  # the first two tasks drawn always win: uniform reward 1
        if len(first_round) < 2:
            first_round.add(seed)
        return seed in first_round

    runner, _ = make_runner(tokenizer, make_config(filter_uniform=True, extra=2),
                            lambda c: LongEnv(horizon=1),
                            policy=alternating_by_task(tokenizer, uniform))
    result = asyncio.run(runner.collect(0, 8))
    assert result.dropped == {"long": {"uniform reward 1": 2}}
    assert result.num_rounds == 2 and result.fallback_groups == 0
    assert sorted(g.group_id for g in result.groups) == ["s0-g2", "s0-g3"]  # the refill
    assert len(result.rollouts) == 8
    assert all(drop_reason(g) is None for g in result.groups)
    assert not {g.task_seed for g in result.groups} & first_round
    assert result.num_played == {"long": 16}  # both rounds' rollouts were played


def test_uniform_groups_hit_the_cap_and_fall_back_with_a_warning(tokenizer):
    runner, _ = make_runner(tokenizer, make_config(filter_uniform=True, extra=2),
                            lambda c: LongEnv(horizon=1, reward=0.5))
    with pytest.warns(UserWarning, match="max_extra_collections"):
        result = asyncio.run(runner.collect(0, 8))
    assert result.num_rounds == 3
    assert result.dropped == {"long": {"uniform reward 0.5": 6}}  # 2 groups × 3 rounds
    assert result.fallback_groups == 2 and len(result.rollouts) == 8


def test_all_invalid_groups_are_counted_by_reason(tokenizer):
    runner, _ = make_runner(tokenizer, make_config(filter_uniform=True, extra=0),
                            lambda c: LongEnv(horizon=2, fail_at=1))
    with pytest.warns(UserWarning):
        result = asyncio.run(runner.collect(0, 8))
    assert result.dropped == {"long": {"all invalid": 2}}


def test_drop_reason_examples():
    def group(*rewards, valid=None):
        valid = valid or [True] * len(rewards)
        return Group("g", "e", [Rollout(f"r{i}", "g", "e", [], r, v)
                                for i, (r, v) in enumerate(zip(rewards, valid, strict=True))])

    assert drop_reason(group(1.0, 1.0)) == "uniform reward 1"
    assert drop_reason(group(1.0, 0.0)) is None
    assert drop_reason(group(1.0, 0.0, valid=[True, False])) == "uniform reward 1"
    assert drop_reason(group(1.0, 0.0, valid=[False, False])) == "all invalid"


def test_environment_shares_follow_weights(tokenizer):
    config = make_config(envs=("a", "b"))
    runner, _ = make_runner(tokenizer, config, lambda c: LongEnv(horizon=1))
    result = asyncio.run(runner.collect(0, 8))
    assert sorted(g.env for g in result.groups) == ["a", "b"]


def test_registered_environment_with_the_torch_engine(tiny_model, tokenizer):
    from agentrl.engines.torch_engine import TorchEngine

    config = config_from_dict({
        "environments": [{"id": "agentrl/Countdown-v0", "name": "countdown"}],
        "batch": {"rollout_batch_size": 1, "n_samples_per_prompt": 2, "global_batch_size": 2},
        "rollout": {"max_new_tokens": 8},
    })
    engine = TorchEngine(tiny_model, tokenizer, max_len=2048)
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler({"countdown": 1}, 0))
    result = asyncio.run(runner.collect(0, 2))
    assert [r.env for r in result.rollouts] == ["countdown", "countdown"]
    for rollout in result.rollouts:
        assert rollout.valid and 1 <= rollout.num_generated_tokens <= 8 * 8
        assert rollout.segments[0].num_prompt_tokens > 0


def test_groups_finish_out_of_order_and_are_kept_as_they_complete(tokenizer):
    created = {"n": 0}

    def factory(env_config):
        created["n"] += 1  # the first group's four rollouts are slow
        return LongEnv(horizon=1, delay_s=0.3 if created["n"] <= 4 else 0.0)

    runner, _ = make_runner(tokenizer, make_config(), factory)
    result = asyncio.run(runner.collect(0, 8))
    assert [g.group_id for g in result.groups] == ["s0-g1", "s0-g0"]
    # train.deterministic: still concurrent, but kept in launch order, whatever the timing
    created["n"] = 0
    runner, _ = make_runner(tokenizer, make_config(deterministic=True), factory)
    result = asyncio.run(runner.collect(0, 8))
    assert [g.group_id for g in result.groups] == ["s0-g0", "s0-g1"]


def test_an_engine_refusal_invalidates_only_that_rollout(tokenizer):
    class RefusingEngine(ScriptedEngine):
        async def generate(self, prompt_ids, params, key=None):
            if params.seed % 3 == 0:
                raise ValueError("prompt of 5000 tokens exceeds max_len 4096")
            return await super().generate(prompt_ids, params, key)

    config = make_config()  # without retries: a refused first request is retried else
    config = msgspec.structs.replace(
        config, rollout=msgspec.structs.replace(config.rollout, max_retries=0))
    names = [e.display_name() for e in config.environments]
    engine = RefusingEngine(tokenizer, win_on_even_seed(tokenizer))
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler({n: 1.0 for n in names},
                           seed=0), make_env=lambda c: LongEnv(horizon=1))
    result = asyncio.run(runner.collect(0, 8))
    refused = [r for r in result.rollouts if not r.valid]
    assert len(result.rollouts) == 8 and 0 < len(refused) < 8
    assert all("engine refused the request: prompt of 5000" in r.stats.error for r in refused)


# ----------------------------------------------------------------------------- the plan


def alternating_by_task(tokenizer, uniform_tasks):
    """Replies "win" then "lose" in turn to each task, so every group of two or more
    rollouts is mixed, except tasks in ``uniform_tasks(task_seed)``, which always win."""
    calls: dict[int, int] = {}

    def policy(prompt, params):
        text = tokenizer.decode(prompt)
        seed = int(text.rsplit("Task ", 1)[1].split(":", 1)[0])
        if uniform_tasks(seed):
            return "win"
        calls[seed] = calls.get(seed, 0) + 1
        return "win" if calls[seed] % 2 else "lose"

    return policy


def mixed_config(sizes, weights, groups_per_weight, extra, deterministic=False):
    """Environments e0.. with their own group sizes and weights; a collection of
    ``groups_per_weight`` × Σ weights groups, one update of all its rollouts."""
    num_groups = groups_per_weight * sum(weights)
    num_rollouts = sum(groups_per_weight * w * s for w, s in zip(weights, sizes, strict=True))
    if len(set(sizes)) == 1:
        num_rollouts = num_groups * sizes[0]
    return config_from_dict({
        "environments": [{"id": f"test:e{i}", "name": f"e{i}", "weight": w, "group_size": s}
                         for i, (s, w) in enumerate(zip(sizes, weights, strict=True))],
        "batch": {"rollout_batch_size": num_groups, "global_batch_size": num_rollouts},
        "rollout": {"filter_uniform_groups": True, "max_extra_collections": extra,
                    "max_turns": 2},
        "train": {"deterministic": deterministic},
    })


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    envs=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), min_size=1, max_size=3),
    groups_per_weight=st.integers(1, 2),
    uniform_share=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    extra=st.integers(0, 3),
    steps=st.integers(1, 3),
)
def test_every_collection_holds_exactly_the_plan(tokenizer, envs, groups_per_weight,
                                                 uniform_share, extra, steps):
    """Whatever the group sizes, weights and filter outcomes: exactly the planned
    rollouts, each environment exactly its groups (its floor or ceil of n·share when
    the sizes are equal, its whole share when they differ), dropped groups replaced by
    groups of the same environment."""
    from agentrl.config.accounting import plan_batches

    sizes, weights = [s for s, _ in envs], [w for _, w in envs]
    config = mixed_config(sizes, weights, groups_per_weight, extra)
    plan = plan_batches(config)
    salt = random.Random(sum(sizes) * 31 + sum(weights)).random()

    def uniform(seed):
        return random.Random(seed + salt).random() < uniform_share

    runner, _ = make_runner(tokenizer, config, lambda c: LongEnv(horizon=1),
                            policy=alternating_by_task(tokenizer, uniform))
    runner.sampler = EnvironmentSampler({e.name: e.weight for e in config.environments}, 0)
    for step in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the fallback warns
            result = asyncio.run(runner.collect(step, plan.num_rollouts))
        assert len(result.rollouts) == plan.num_rollouts
        assert len(result.groups) == plan.num_groups
        for share in plan.envs:
            mine = [g for g in result.groups if g.env == share.name]
            if len(set(sizes)) > 1:
                assert len(mine) == share.num_groups
            else:
                assert math.floor(share.num_groups + 1e-9) <= len(mine) <= math.ceil(
                    share.num_groups - 1e-9)
            assert all(len(g.rollouts) == share.group_size for g in mine)
        kept_with_signal = [g for g in result.groups if drop_reason(g) is None]
        assert len(kept_with_signal) == len(result.groups) - result.fallback_groups
        ids = [r.rollout_id for r in result.rollouts]
        assert len(set(ids)) == len(ids)

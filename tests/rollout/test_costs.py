"""Cost per environment (agentrl.observe.costs): each rollout's share of the engine's busy
time, its environment and sandbox seconds, its tokens; and a price table over them."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.config import ConfigError, CostsConfig, config_from_dict
from agentrl.engines.interface import Generation
from agentrl.observe.costs import PlayedCosts, cost_figures
from agentrl.rollout.env_guard import GuardedEnv
from agentrl.rollout.metering import EngineClock
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Message, Spend
from tests.rollout.stand_ins import LongEnv, ScriptedEngine

STEP_S = 0.05
"""What each environment step of the slow stand-in sleeps."""
ENGINE_S = 0.05
"""What each request of the slow engine sleeps."""


class SlowEngine(ScriptedEngine):
    """The scripted engine, each request taking ENGINE_S."""

    async def generate(self, prompt_ids, params, key=None) -> Generation:
        await asyncio.sleep(ENGINE_S)
        return await super().generate(prompt_ids, params, key)


def _config(group_size: int = 2, extra: dict | None = None):
    return config_from_dict({
        "environments": [{"id": "test:slow", "name": "slow"}],
        "batch": {"rollout_batch_size": 1, "n_samples_per_prompt": group_size,
                  "global_batch_size": group_size},
        "rollout": {"max_turns": 4},
        **(extra or {}),
    })


def test_engine_time_is_shared_among_the_requests_in_flight() -> None:
    now = [0.0]
    clock = EngineClock(lambda: now[0])
    a = clock.begin()            # t=0: a alone
    now[0] = 1.0
    b = clock.begin()            # t=1: a and b share [1, 3)
    now[0] = 3.0
    charge_a = clock.end(a)      # a: 1 + 2/2 = 2
    now[0] = 4.0                 # b alone in [3, 4)
    charge_b = clock.end(b)      # b: 2/2 + 1 = 2
    now[0] = 9.0                 # idle time is nobody's
    c = clock.begin()
    now[0] = 9.5
    assert (charge_a, charge_b, clock.end(c)) == (2.0, 2.0, 0.5)
    # the shares add up to the busy seconds (4.5), not the requests' wall time (6.5)


def test_a_collection_counts_env_seconds_engine_share_and_tokens_per_rollout(tokenizer):
    """Two rollouts of 2 steps each: every step sleeps STEP_S, every request ENGINE_S."""
    engine = SlowEngine(tokenizer, lambda prompt, params: "probe")
    runner = RolloutRunner(_config(), engine, tokenizer, EnvironmentSampler({"slow": 1.0}, 0),
                           make_env=lambda c: LongEnv(horizon=2, delay_s=STEP_S, reward=1.0))
    start = time.perf_counter()
    result = asyncio.run(runner.collect(step=1, num_rollouts_needed=2))
    wall_s = time.perf_counter() - start
    spends = [r.stats.spend for r in result.rollouts]
    assert len(spends) == 2
    for spend in spends:
        assert 2 * STEP_S <= spend.env_s < wall_s  # two steps, plus reset and close
        assert spend.sandbox_s == 0.0
    # the engine was busy at least the two rounds of requests; the shares never add up
    # to more than the collection's wall time (summed request times of concurrent
    # rollouts would)
    total_generation = sum(s.generation_s for s in spends)
    assert 2 * ENGINE_S <= total_generation <= wall_s
    # tokens, counted by construction: every prompt the engine received, every id it sent
    assert sum(s.num_prompt_tokens for s in spends) == sum(len(p) for p in engine.prompts)
    assert sum(s.num_generated_tokens for s in spends) == sum(
        len(g.token_ids) for g in engine.generations)
    assert sum(s.num_generated_tokens for s in spends) == sum(
        r.num_generated_tokens for r in result.rollouts)
    played = result.costs["slow"]
    assert played.num_rollouts == 2 and played.reward_sum == 2.0
    assert played.env_s == pytest.approx(sum(s.env_s for s in spends))

    # a price on tokens only gives an exact cost: 2 per generated token, 1 per prompt one
    prices = CostsConfig(per_million_generated_tokens=2e6, per_million_prompt_tokens=1e6)
    figures = cost_figures(result.costs, prices, cumulative_cost=10.0)
    generated, prompt = played.num_generated_tokens, played.num_prompt_tokens
    assert figures["env/slow/cost/generated_tokens"] == generated
    assert figures["env/slow/cost/prompt_tokens"] == prompt
    assert figures["env/slow/cost/env_seconds"] == played.env_s
    assert figures["cost/step"] == figures["env/slow/cost/step"] == pytest.approx(
        2 * generated + prompt)
    assert figures["env/slow/cost/per_reward_point"] == pytest.approx(
        (2 * generated + prompt) / 2.0)
    assert figures["cumulative/cost"] == pytest.approx(10.0 + 2 * generated + prompt)


class LoopBlockingEngine(ScriptedEngine):
    """The scripted engine, each request holding the event loop BLOCK_S (as the built-in
    engine's forward passes do, on the same loop as the environments' calls)."""

    async def generate(self, prompt_ids, params, key=None) -> Generation:
        await asyncio.sleep(0.01)  # the others' steps start meanwhile, then wait on us
        time.sleep(BLOCK_S)
        return await super().generate(prompt_ids, params, key)


BLOCK_S = 0.3


def test_env_seconds_are_the_environments_not_the_busy_loops(tokenizer):
    # instant steps, while the other rollout's requests keep the loop from noticing that
    # they are done: the loop-side wait would be ~BLOCK_S per step
    engine = LoopBlockingEngine(tokenizer, lambda prompt, params: "probe")
    runner = RolloutRunner(_config(group_size=4), engine, tokenizer,
                           EnvironmentSampler({"slow": 1.0}, 0),
                           make_env=lambda c: LongEnv(horizon=2, reward=1.0))
    start = time.perf_counter()
    result = asyncio.run(runner.collect(step=1, num_rollouts_needed=4))
    assert time.perf_counter() - start >= 8 * BLOCK_S  # 4 rollouts x 2 requests
    assert all(r.stats.spend.env_s < BLOCK_S / 2 for r in result.rollouts), [
        r.stats.spend.env_s for r in result.rollouts]


def test_the_price_table_prices_every_figure_per_environment() -> None:
    """A hand-worked step of two environments."""
    played = {
        "code": PlayedCosts(generation_s=2.0, env_s=4.0, sandbox_s=1.5,
                            num_generated_tokens=3_000_000, num_prompt_tokens=10_000_000,
                            num_rollouts=4, reward_sum=2.0),
        "math": PlayedCosts(generation_s=1.0, env_s=0.5, num_generated_tokens=1_000_000,
                            num_prompt_tokens=2_000_000, num_rollouts=4, reward_sum=0.0),
    }
    prices = CostsConfig(per_generation_second=0.5, per_env_second=0.25,
                         per_sandbox_second=2.0, per_million_generated_tokens=1.0,
                         per_million_prompt_tokens=0.125)
    figures = cost_figures(played, prices, cumulative_cost=1.0)
    # code: 2*0.5 + 4*0.25 + 1.5*2 + 3*1 + 10*0.125 = 1 + 1 + 3 + 3 + 1.25
    assert figures["env/code/cost/step"] == 9.25
    assert figures["env/code/cost/per_reward_point"] == 9.25 / 2.0
    # math: 0.5 + 0.125 + 0 + 1 + 0.25; its reward sum is 0: no cost per reward point
    assert figures["env/math/cost/step"] == 1.875
    assert "env/math/cost/per_reward_point" not in figures
    assert figures["cost/step"] == 11.125 and figures["cumulative/cost"] == 12.125
    assert figures["cost/per_reward_point"] == 11.125 / 2.0
    assert figures["cost/generation_seconds"] == 3.0 and figures["cost/prompt_tokens"] == 12e6
    assert figures["cost/sandbox_seconds"] == 1.5
    # without a price table: the seconds and tokens alone
    plain = cost_figures(played, None)
    assert plain["env/code/cost/env_seconds"] == 4.0
    assert not any(k.endswith(("/step", "per_reward_point")) or k == "cumulative/cost"
                   for k in plain)


class SandboxEnv:
    """One step that runs ``time.sleep(0.2)`` in the sandbox, then ends."""

    isolation = "thread"

    def reset(self, *, seed=None, options=None):
        return [Message("user", "run it")], {}

    def step(self, action):
        from agentrl.sandbox import run_python

        result = run_python("import time; time.sleep(0.2); print('done')")
        return [Message("tool", result.stdout)], 1.0, True, False, {}


def make_sandbox_env() -> SandboxEnv:
    return SandboxEnv()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_sandbox_seconds_are_counted_inside_env_seconds(isolation) -> None:
    async def play() -> Spend:
        env = await GuardedEnv.open("code", make_sandbox_env, 60.0, 10_000, isolation)
        await env.reset(0)
        result = await env.step("go")
        await env.close()
        assert result[0][0].content.strip() == "done"
        spend = Spend()
        env.record_time(spend)
        return spend

    spend = asyncio.run(play())
    assert 0.2 <= spend.sandbox_s <= spend.env_s


@pytest.mark.parametrize("field", ["per_generation_second", "per_env_second",
                                   "per_sandbox_second", "per_million_generated_tokens",
                                   "per_million_prompt_tokens"])
def test_a_negative_price_is_refused_naming_the_field(field) -> None:
    with pytest.raises(ConfigError, match=rf"^log\.costs\.{field} = -1\.0 is out of range"):
        _config(extra={"log": {"costs": {field: -1.0}}})


def test_the_price_table_loads_from_toml(tmp_path) -> None:
    from agentrl.config import load_config

    path = tmp_path / "run.toml"
    path.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n\n'
                    "[log.costs]\nper_generation_second = 0.001\n"
                    "per_million_prompt_tokens = 0.5\n")
    costs = load_config(path).log.costs
    assert costs == CostsConfig(per_generation_second=0.001, per_million_prompt_tokens=0.5)
    assert load_config(path, overrides=["log.costs.per_env_second=0.01"]).log.costs \
        .per_env_second == 0.01


@pytest.mark.parametrize("page", ["README.md", "docs/costs.md"])
def test_the_documented_price_table_loads(page, tmp_path) -> None:
    import re
    from pathlib import Path

    from agentrl.config import load_config

    text = (Path(__file__).resolve().parents[2] / page).read_text()
    [block] = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if "[log.costs]" in b]
    path = tmp_path / "run.toml"
    path.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n\n' + block)
    costs = load_config(path).log.costs
    assert costs is not None and costs.per_generation_second == 0.0011
    assert costs.per_sandbox_second == 0.0001

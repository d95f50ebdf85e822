"""A broken, slow or GIL-holding environment masks its rollouts, never the collection.

Each case of issue #13 runs a real runner collection with two environments, a fine one
and a broken one: the collection returns every rollout, the fine ones are valid, the
broken ones are invalid with the kind and the words the contract promises, and the
counts per environment and kind are in the collection result.
"""

from __future__ import annotations

import asyncio
import math
import time
import warnings

import pytest

from agentrl.config import RolloutConfig, config_from_dict
from agentrl.rollout.env_contract import INVALID_KINDS, EnvError, check_reward
from agentrl.rollout.health import InvalidRolloutWarning
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.rollout.runner import RolloutRunner, clip_long_rows
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Rollout, RolloutStats, Segment
from tests.rollout.broken_envs import make_broken
from tests.rollout.stand_ins import LongEnv, ScriptedEngine


def make_config(envs: list[dict], group_size: int = 2, **rollout) -> object:
    return config_from_dict({
        "environments": envs,
        "batch": {"rollout_batch_size": len(envs), "n_samples_per_prompt": group_size,
                  "global_batch_size": len(envs) * group_size},
        "rollout": {"max_turns": 3, "step_timeout_s": 0.5, **rollout},
    })


def collect(tokenizer, config, make_env=None, step: int = 0):
    names = {e.display_name(): 1.0 for e in config.environments}
    engine = ScriptedEngine(tokenizer, lambda prompt, params: "go")
    kwargs = {"make_env": make_env} if make_env is not None else {}
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler(names, 0), **kwargs)
    return runner, asyncio.run(runner.collect(step, config.batch.global_batch_size))


CASES = [
    ("reward_none", "bad_reward", "step() returned reward None (NoneType); expected a finite"),
    ("reward_high", "bad_reward", "step() returned reward 'high' (str); expected a finite float"),
    ("reward_numeric_string", "bad_reward", "reward '1.0' (str); expected a finite float"),
    ("reward_nan", "bad_reward", "step() returned reward nan (float); expected a finite float"),
    ("reward_inf", "bad_reward", "step() returned reward inf (float); expected a finite float"),
    ("reward_out_of_range", "bad_reward", "reward 5.0, outside the declared reward_range"),
    ("observation_str", "bad_observation",
     "step() returned observation 'hello' (str); expected a list of agentrl.types.Message"),
    ("observation_int", "bad_observation", "step() returned observation 3 (int); expected a "
                                           "list of agentrl.types.Message"),
    ("observation_surrogate", "bad_observation", "content holding a lone surrogate"),
    ("observation_10mb", "bad_observation", "an observation of 10000000 characters, more "
                                            "than rollout.max_observation_chars = 100000"),
    ("four_tuple", "bad_step", "step() returned a 4-tuple; expected a 5-tuple"),
    ("info_none", "bad_info", "step() returned info None (NoneType); expected a dict"),
    ("terminated_int", "bad_step", "returned terminated 1 (int); expected a bool"),
    ("step_raises", "step_raised", "step() raised RuntimeError: tool crashed"),
    ("tool_schemas_raises", "tool_schemas_raised",
     "tool_schemas() raised RuntimeError: schemas broke"),
    ("tool_schemas_not_json", "bad_tool_schemas", "is not JSON"),
    ("close_raises", "close_raised", "close() raised OSError: close failed"),
    ("constructor_raises", "construct_raised",
     "the constructor raised ValueError: bad constructor argument"),
    ("reset_str", "bad_observation", "reset() returned observation 'the task' (str)"),
    ("slow_reset", "reset_timeout", "reset() timed out: no return within 0.5 s"),
]


@pytest.mark.parametrize("mode, kind, words", CASES, ids=[c[0] for c in CASES])
def test_broken_environment_masks_only_its_rollouts(tokenizer, mode, kind, words):
    config = make_config([{"id": "test:fine", "name": "fine"},
                          {"id": "test:bad", "name": "bad"}])

    def factory(env_config):
        return LongEnv(horizon=2) if env_config.name == "fine" else make_broken(mode)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, result = collect(tokenizer, config, factory)
    by_env = {name: [r for r in result.rollouts if r.env == name] for name in ("fine", "bad")}
    assert len(by_env["fine"]) == 2 and all(r.valid for r in by_env["fine"])
    assert len(by_env["bad"]) == 2
    for rollout in by_env["bad"]:
        assert not rollout.valid and rollout.stats.error_kind == kind
        assert words in rollout.stats.error and "'bad'" in rollout.stats.error
        assert math.isfinite(rollout.reward)  # reward copies must still compare equal
    assert result.invalid == {"bad": {kind: 2}} and result.num_played == {"fine": 2, "bad": 2}
    reports = [w for w in caught if issubclass(w.category, InvalidRolloutWarning)]
    assert len(reports) == 1 and words in str(reports[0].message)  # the first one, once
    assert f"bad/{kind}" in result.first_errors


def test_a_slow_constructor_has_the_rollout_deadline(tokenizer):
    config = make_config([{"id": "test:bad", "name": "bad"}], rollout_timeout_s=0.3)
    _, result = collect(tokenizer, config, lambda c: make_broken("slow_constructor"))
    assert [r.stats.error_kind for r in result.rollouts] == ["construct_timeout"] * 2
    assert "the constructor timed out: no return within 0.3 s" in result.rollouts[0].stats.error
    # the time it was given is still the environment's cost
    assert all(r.stats.spend.env_s >= 0.3 for r in result.rollouts)


def test_a_worker_stuck_in_c_code_dies_with_the_trainer(tmp_path):
    # the "trainer" starts a StuckEnv worker (minutes of C code per step), steps it and
    # dies mid-call with os._exit; the worker (and the forkserver) must not outlive it
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    root = str(Path(__file__).resolve().parents[2])
    log = tmp_path / "trainer.log"
    with log.open("w") as sink:  # a file, not a pipe: a surviving worker would hold a pipe
        subprocess.run([sys.executable, str(script)], stdout=sink, stderr=subprocess.STDOUT,
                       timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": root})
    pid = int(log.read_text().split()[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, 9)  # do not leave it burning a core
        pytest.fail(f"worker {pid} outlived the trainer")


TRAINER_SCRIPT = """
import asyncio, functools, os
from agentrl.envs.registry import make
from agentrl.rollout.env_guard import GuardedEnv

async def main():
    factory = functools.partial(make, "tests.rollout.broken_envs:StuckEnv")
    env = await GuardedEnv.open("g", factory, 60, 100_000, "process")
    await env.reset(0)
    print(env.caller.process.pid, flush=True)
    asyncio.ensure_future(env.step("x"))
    await asyncio.sleep(1.0)  # the worker is now deep in the regex, the GIL held
    os._exit(0)

if __name__ == "__main__":
    asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_every_kind_in_the_table_is_a_documented_kind():
    assert {kind for _, kind, _ in CASES} <= set(INVALID_KINDS)


def test_reward_scale_nan_invalidates_at_the_source(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt, params: "win")
    for scale in (float("nan"), float("inf")):
        spec = RolloutSpec("s0-g0-r0", "s0-g0", "long", task_seed=1, reward_scale=scale)
        rollout = asyncio.run(play_rollout(spec, LongEnv(horizon=1), engine, tokenizer,
                                           RolloutConfig(), _compaction()))
        assert not rollout.valid and rollout.stats.error_kind == "bad_reward"
        assert "x reward_scale" in rollout.stats.error and rollout.reward == 0.0


def test_step_rewards_that_overflow_when_summed_invalidate():
    assert check_reward("e", 1e308) == 1e308
    with pytest.raises(EnvError, match="expected a finite float"):
        check_reward("e", 10**400)  # an int past the float range
    assert check_reward("e", True) == 1.0 and check_reward("e", 3) == 3.0


def test_queueing_does_not_count_against_the_step_deadline(tokenizer):
    # 64 concurrent rollouts whose steps each take 0.2 s, a 1 s deadline: with asyncio's
    # default pool (~6 threads here) most of them used to time out while queued
    config = make_config([{"id": "test:slow", "name": "slow"}], group_size=64,
                         step_timeout_s=1.0, max_concurrent_rollouts=64)
    start = time.perf_counter()
    _, result = collect(tokenizer, config, lambda c: LongEnv(horizon=2, delay_s=0.2))
    assert len(result.rollouts) == 64 and all(r.valid for r in result.rollouts)
    assert result.invalid == {}
    assert time.perf_counter() - start < 10  # concurrent: 64 x 0.4 s serially is 25.6 s


def test_a_step_holding_the_gil_is_cut_off_in_a_worker_process(tokenizer):
    # GilEnv holds the GIL ~10 s in C code; in a worker process the 0.5 s deadline holds
    config = make_config([{"id": "tests.rollout.broken_envs:GilEnv", "name": "gil"},
                          {"id": "tests.rollout.broken_envs:ProcessFineEnv", "name": "ok"}])
    start = time.perf_counter()
    _, result = collect(tokenizer, config)
    seconds = time.perf_counter() - start
    gil = [r for r in result.rollouts if r.env == "gil"]
    kinds = [(r.stats.error_kind, r.stats.error, r.retry_of) for r in gil]
    assert all(r.stats.error_kind == "step_timeout" for r in gil) and len(gil) == 2, kinds
    assert "worker process was killed" in gil[0].stats.error
    assert all(r.valid for r in result.rollouts if r.env == "ok")
    assert seconds < 10.0, seconds  # in-process the two steps would hold the loop ~20 s


def test_worker_process_death_and_violations_read_the_same(tokenizer):
    config = make_config([{"id": "tests.rollout.broken_envs:CrashEnv", "name": "crash"},
                          {"id": "tests.rollout.broken_envs:ProcessHighRewardEnv",
                           "name": "bad"}], group_size=1)
    _, result = collect(tokenizer, config)
    errors = {r.env: r.stats for r in result.rollouts}
    assert errors["crash"].error_kind == "worker_died"
    assert "worker process died during step() (exit code 3)" in errors["crash"].error
    assert errors["bad"].error == ("env 'bad': step() returned reward 'high' (str); "
                                   "expected a finite float")


def test_a_gil_stall_in_process_moves_the_environment_to_worker_processes(tokenizer):
    config = make_config([{"id": "tests.rollout.broken_envs:GilInThreadEnv",
                           "name": "gil"}], group_size=1, step_timeout_s=0.5)
    names = {"gil": 1.0}
    runner = RolloutRunner(config, ScriptedEngine(tokenizer, lambda p, s: "go"), tokenizer,
                           EnvironmentSampler(names, 0))
    with pytest.warns(UserWarning, match="its next rollouts run in worker processes"):
        first = asyncio.run(runner.collect(0, 1))
    assert first.rollouts[0].stats.error_kind == "step_timeout"
    # whether the loop saw the deadline pass or the late result first, the error says why
    assert 'code that holds the GIL needs isolation = "process"' in first.rollouts[0].stats.error
    second = asyncio.run(runner.collect(1, 1))
    assert "worker process was killed" in second.rollouts[0].stats.error


def test_rows_past_the_micro_batch_budget_are_cut_and_masked():
    segment = Segment(token_ids=list(range(10)), loss_mask=[0] * 4 + [1] * 6,
                      logprobs=[0.0] * 10, num_prompt_tokens=4)
    rollout = Rollout("r0", "g0", "e", [segment], reward=1.0, stats=RolloutStats())
    error = clip_long_rows(rollout, max_tokens=6)
    assert error is not None and error.kind == "row_too_long" and not rollout.valid
    assert "a row of 10 tokens is longer than batch.max_tokens_per_microbatch = 6" in str(error)
    assert rollout.segments[0].token_ids == list(range(6))
    assert len(rollout.segments[0].loss_mask) == len(rollout.segments[0].logprobs) == 6
    assert clip_long_rows(rollout, max_tokens=6) is None  # fits now


def _compaction():
    from agentrl.config import CompactionConfig

    return CompactionConfig()

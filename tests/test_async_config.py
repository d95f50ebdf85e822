"""Settings of asynchronous collection, the off-policy corrections and square-root lr
scaling: what combines, what is refused (with the fix), and the lr `agentrl plan` prints."""

from __future__ import annotations

import math

import pytest

from agentrl.cli import main
from agentrl.config import ConfigError, config_from_dict
from agentrl.config.schedule import effective_lr

BASE = {"environments": [{"id": "agentrl/Countdown-v0"}],
        "batch": {"rollout_batch_size": 8, "n_samples_per_prompt": 8, "global_batch_size": 64}}


def _config(**sections):
    raw = {**BASE}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw)


def test_sqrt_scaling_by_hand():
    assert effective_lr(_config(optim={"lr": 1e-5})) == 1e-5
    # 64 rollouts per update against a reference of 16: lr × sqrt(4) = 2e-5
    config = _config(optim={"lr": 1e-5, "lr_scaling": "sqrt", "lr_reference_batch": 16})
    assert effective_lr(config) == pytest.approx(2e-5)
    config = _config(optim={"lr": 1e-5, "lr_scaling": "sqrt", "lr_reference_batch": 128})
    assert effective_lr(config) == pytest.approx(1e-5 * math.sqrt(0.5))


@pytest.mark.parametrize("optim, message", [
    ({"lr_scaling": "sqrt"}, "needs optim.lr_reference_batch"),
    ({"lr_reference_batch": 16}, 'lr_scaling = "none"'),
    ({"lr_scaling": "sqrt", "lr_reference_batch": 2}, "32× optim.lr_reference_batch"),
    ({"lr_scaling": "sqrt", "lr_reference_batch": 4096}, "only trusted within 16×"),
])
def test_lr_scaling_refusals(optim, message):
    with pytest.raises(ConfigError, match=message):
        _config(optim=optim)


@pytest.mark.parametrize("sections, message", [
    ({"rollout": {"max_staleness": -1}}, "max_staleness = -1 is out of range"),
    ({"rollout": {"inflight_updates": True}}, "needs rollout.max_staleness >= 1"),
    ({"rollout": {"max_staleness": 1, "engine": "vllm"}}, "vLLM cannot sleep"),
    ({"rollout": {"max_staleness": 1, "inflight_updates": True, "engine": "vllm",
                  "placement": "separate"}}, "needs local built-in replicas"),
    ({"rollout": {"collector": "process"}}, 'collector = "process" moves'),
    ({"rollout": {"max_staleness": 1, "collector": "process", "engine": "vllm",
                  "placement": "separate"}}, "local vLLM replicas already generate"),
    ({"loss": {"objective": "decoupled", "tis_cap": None}}, "needs loss.old_logprobs"),
    ({"loss": {"objective": "decoupled", "old_logprobs": "engine"}}, "proximal policy"),
    ({"loss": {"negative_advantage_veto": 0.5}}, "must be a finite number > 1"),
    ({"loss": {"relaxed_clip_eps_high": 0.1}}, "narrower than loss.clip_eps_high"),
])
def test_off_policy_refusals(sections, message):
    with pytest.raises(ConfigError, match=message):
        _config(**sections)


def test_async_settings_that_combine():
    config = _config(rollout={"max_staleness": 2, "inflight_updates": True},
                     loss={"objective": "decoupled", "negative_advantage_veto": 2.0,
                           "relaxed_clip_eps_low": 0.3, "relaxed_clip_eps_high": 0.5})
    assert config.rollout.max_staleness == 2 and config.loss.objective == "decoupled"


def test_plan_prints_the_effective_lr(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n[batch]\n'
                    "rollout_batch_size = 8\nn_samples_per_prompt = 8\nglobal_batch_size = 64\n"
                    "[optim]\nlr = 3e-6\n")
    assert main(["plan", str(path)]) == 0
    assert "learning rate: 3e-06 (peak)" in capsys.readouterr().out
    assert main(["plan", str(path), "--set", 'optim.lr_scaling="sqrt"',
                 "--set", "optim.lr_reference_batch=16"]) == 0
    assert "learning rate: 6e-06 (peak) = 3e-06 × sqrt(64 / 16)" in capsys.readouterr().out
    assert main(["plan", str(path), "--set", "rollout.max_staleness=1",
                 "--set", 'rollout.collector="process"']) == 0
    assert "the rollout side runs in a process of its own" in capsys.readouterr().out


def test_the_async_bench_config_and_its_slow_tool_environment():
    import asyncio
    import importlib
    import time

    bench = importlib.import_module("bench.async")  # "async" is a keyword: no import stmt
    sync, k2 = bench.bench_config(0, 3, quick=True), bench.bench_config(2, 3, quick=True)
    assert [e.display_name() for e in k2.environments] == ["calculator", "countdown",
                                                           "slow_calculator"]
    assert (sync.loss.objective, k2.loss.objective) == ("ppo", "decoupled")
    assert k2.rollout.max_staleness == 2 and k2.train.num_steps == 3
    # carry-over on (the default), in-flight updates off: measured slower on this engine
    assert k2.rollout.carry_over and not k2.rollout.inflight_updates
    assert not sync.rollout.inflight_updates
    served = bench.bench_config(1, 3, True, remote_engines=("http://127.0.0.1:8123",))
    assert served.rollout.remote_engines == ["http://127.0.0.1:8123"]  # --engine-process
    assert sync.rollout.remote_engines == []

    from agentrl.envs.registry import make

    env = make("bench.slow_tools:SlowToolCalculator", max_number=9, latency_s=0.3)
    env.reset(seed=1)
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "3+4"}}</tool_call>'
    start = time.perf_counter()
    observation, *_ = asyncio.run(env.astep(call))
    assert time.perf_counter() - start >= 0.3 and observation[0].content == "7"
    start = time.perf_counter()
    _, _, terminated, _, _ = asyncio.run(env.astep("7"))  # a final answer: no tool, no wait
    assert terminated and time.perf_counter() - start < 0.3

"""Gymnasium's checker on every registered environment, seeding, splits, make, the CLI."""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.envs.agent_env import AgentEnv
from agentrl.envs.registry import BUILTINS, make, registered_ids

EXAMPLE = "examples.custom_env.reverse_word:ReverseWordEnv"
SMALL = {"agentrl/KVStore-v0": {"chain_length": 3, "padding_words": 4},
         "agentrl/Python-v0": {"cpu_s": 2, "wall_s": 5}}


def test_every_builtin_is_registered():
    assert set(BUILTINS) <= set(registered_ids())
    assert len(BUILTINS) == 8


@pytest.mark.parametrize("env_id", sorted(BUILTINS))
def test_gymnasium_check_env(env_id):
    env = gymnasium.make(env_id, disable_env_checker=True).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning is a failure
        check_env(env)


@pytest.mark.parametrize("env_id", sorted(BUILTINS) + [EXAMPLE])
def test_same_seed_same_task_and_splits_disjoint(env_id):
    env, other = make(env_id, **SMALL.get(env_id, {})), make(env_id, **SMALL.get(env_id, {}))
    assert env.reset(seed=7)[0] == other.reset(seed=7)[0]
    train = {env.reset(seed=s)[1]["split"] + env.task.key for s in range(30)}
    evals = {env.reset(seed=s, options={"split": "eval"})[1]["split"] + env.task.key
             for s in range(10)}
    train_keys = {k.removeprefix("train") for k in train}
    eval_keys = {k.removeprefix("eval") for k in evals}
    assert eval_keys and not train_keys & eval_keys
    assert env.reset(seed=3, options={"split": "eval"})[0] == other.reset(
        seed=3, options={"split": "eval"})[0]


def test_make_errors_name_the_id():
    with pytest.raises(ValueError, match="agentrl/Nope-v0.*agentrl/Countdown-v0"):
        make("agentrl/Nope-v0")
    with pytest.raises(ValueError, match="no_such_module"):
        make("no_such_module:Env")
    with pytest.raises(ValueError, match="num_numberz"):
        make("agentrl/Countdown-v0", num_numberz=2)
    with pytest.raises(ValueError, match="split"):
        make("agentrl/Countdown-v0").reset(options={"split": "test"})
    with pytest.raises(ValueError, match="reset"):
        make("agentrl/Countdown-v0").step("hi")


def test_example_env_in_under_60_lines_works():
    from pathlib import Path

    assert len(Path("examples/custom_env/reverse_word.py").read_text().splitlines()) < 60
    env = make(EXAMPLE)
    assert isinstance(env, AgentEnv)
    messages, _ = env.reset(seed=1)
    word = messages[-1].content.removeprefix("Word: ")
    obs = env.step('<tool_call>{"name": "check", "arguments": {"guess": "x"}}</tool_call>')[0]
    assert obs[0].content == "wrong"
    _, reward, terminated, _, _ = env.step(f"<answer>{word[::-1]}</answer>")
    assert (reward, terminated) == (1.0, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no spec: the checker warns it cannot re-make it
        check_env(env)


def test_mix_config_parses_and_plans(capsys):
    config = load_config("examples/mix.toml")
    assert [e.id for e in config.environments] == ["agentrl/Countdown-v0",
                                                    "agentrl/Calculator-v0"]
    assert main(["plan", "examples/mix.toml"]) == 0
    for env in config.environments:
        make(env.id, **env.kwargs).reset(seed=0)


@pytest.mark.parametrize("env_id", sorted(BUILTINS))
def test_check_env_cli(env_id, capsys):
    import json

    args = ["check-env", env_id, "--episodes", "2", "--seed", "1"]
    if env_id in SMALL:
        args += ["--kwargs", json.dumps(SMALL[env_id])]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "gymnasium check_env: passed" in out and "episode 1 (seed 2): reward" in out
    if env_id == "agentrl/KVStore-v0":  # scripted optimal policy
        assert "episode 0 (seed 1): reward 1" in out


def test_check_env_cli_with_actions_file(tmp_path, capsys):
    actions = tmp_path / "actions.txt"
    actions.write_text('<tool_call>{"name": "check", "arguments": {"guess": "a"}}</tool_call>'
                       "\n---\n<answer>nope</answer>\n")
    assert main(["check-env", "examples/custom_env/reverse_word.py:ReverseWordEnv",
                 "--actions", str(actions)]) == 0
    out = capsys.readouterr().out
    assert "[tool:check] wrong" in out and "reward 0" in out
    assert main(["check-env", "agentrl/Nope-v0"]) == 2


BROKEN = "tests.rollout.broken_envs"


@pytest.mark.parametrize("cls, words", [
    ("ProcessHighRewardEnv", f"violation (bad_reward): env '{BROKEN}:ProcessHighRewardEnv': "
                             "step() returned reward 'high' (str); expected a finite float"),
    ("SlowStepEnv", "violation (step_timeout): env '" + BROKEN + ":SlowStepEnv': step() timed "
                    "out: no return within 1 s (its worker process was killed)"),
    ("GilEnv", "step() timed out: no return within 1 s (its worker process was killed)"),
    ("EndlessEnv", "endless episode: it did not end within 5 steps"),
])
def test_check_env_reports_violations_in_the_runners_words_and_never_hangs(cls, words, capsys):
    import time

    start = time.perf_counter()
    status = main(["check-env", f"{BROKEN}:{cls}", "--timeout", "1", "--max-steps", "5"])
    assert status == 1 and time.perf_counter() - start < 20
    assert words in capsys.readouterr().out


def test_check_env_adversarial_texts_find_a_naive_grader(capsys):
    assert main(["check-env", f"{BROKEN}:NaiveGraderEnv", "--actions", "/dev/null",
                 "--adversarial", "--episodes", "0", "--timeout", "5"]) == 1
    out = capsys.readouterr().out
    assert "gymnasium check_env: passed" in out
    assert "adversarial '400 digits'" not in out  # short texts pass
    assert ("adversarial '16k spaces': step_raised: env 'tests.rollout.broken_envs:"
            "NaiveGraderEnv': step() raised ValueError: answer of 16000 characters") in out
    assert "broke the environment: 12;" in out  # the 12 replies past 10,000 characters

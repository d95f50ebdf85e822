"""Held-out accuracy, the README's headline figure, against hand-worked cases."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.cli import main
from agentrl.config import config_from_dict
from agentrl.rollout.evaluation import evaluate
from agentrl.train.run import eval_metrics
from tests.rollout.stand_ins import ScriptedEngine


def config(*names: str, **kwargs):
    return config_from_dict({
        "environments": [{"id": "tests.rollout.eval_envs:SayYes", "name": n, "kwargs": kwargs}
                         for n in names],
        "batch": {"rollout_batch_size": 1, "n_samples_per_prompt": 1, "global_batch_size": 1},
        "rollout": {"max_turns": 1, "max_new_tokens": 8},
    })


def yes_on(tokenizer, tasks: set[int]):
    """Says "yes" to the listed task numbers (read from the prompt), "no" to the others."""
    def policy(prompt, params):
        number = int(tokenizer.decode(prompt).rsplit("Task ", 1)[1].split(":", 1)[0])
        return "yes" if number in tasks else "no"
    return policy


def test_accuracy_counts_the_solved_held_out_tasks(tokenizer):
    engine = ScriptedEngine(tokenizer, yes_on(tokenizer, {0, 1, 3}))
    accuracy = asyncio.run(evaluate(engine, tokenizer, config("a"), num_tasks=5))
    # tasks 0..4 of the eval split; "yes" to 0, 1 and 3: 3 of 5 (each reward 0.5 with
    # "correct" 1: the component decides, not the reward's size)
    assert accuracy == {"a": pytest.approx(0.6)}
    assert len(engine.prompts) == 5  # greedy, one rollout per task


def test_each_environment_gets_its_own_accuracy_and_the_mean(tokenizer):
    engine = ScriptedEngine(tokenizer, yes_on(tokenizer, {0, 2}))
    accuracy = asyncio.run(evaluate(engine, tokenizer, config("a", "b"), num_tasks=4))
    assert accuracy == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}
    metrics = eval_metrics({"a": 0.75, "b": 0.25})
    assert metrics == {"eval/a/accuracy": 0.75, "eval/b/accuracy": 0.25,
                       "eval/accuracy": 0.5}


def test_a_refused_request_counts_as_wrong(tokenizer):
    class Refusing(ScriptedEngine):
        async def generate(self, prompt_ids, params, key=None):
            if "Task 1:" in tokenizer.decode(prompt_ids):
                raise ValueError("prompt too long")
            return await super().generate(prompt_ids, params, key)

    engine = Refusing(tokenizer, lambda prompt, params: "yes")
    accuracy = asyncio.run(evaluate(engine, tokenizer, config("a"), num_tasks=4))
    assert accuracy == {"a": pytest.approx(0.75)}  # tasks 0, 2, 3 solved; 1 invalid


def test_agentrl_eval_prints_the_accuracy_of_a_checkpoint(tiny_ckpt, tmp_path, capsys):
    """The command end to end: a real checkpoint in the built-in engine; the tasks it
    solves are fixed by the environment (tasks 0 and 2 of 4), so the figure is known."""
    toml = tmp_path / "eval.toml"
    toml.write_text(
        '[[environments]]\nid = "tests.rollout.eval_envs:SayYes"\nname = "fixed"\n'
        "kwargs = { always = [0, 2] }\n"
        "[[environments]]\nid = \"tests.rollout.eval_envs:SayYes\"\nname = \"never\"\n"
        "kwargs = { always = [] }\n"
        "[batch]\nrollout_batch_size = 2\nn_samples_per_prompt = 1\nglobal_batch_size = 2\n"
        "[rollout]\nmax_turns = 1\nmax_new_tokens = 4\n")
    assert main(["eval", str(toml), "--checkpoint", str(tiny_ckpt), "--tasks", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["fixed", "accuracy", "0.500", "(4", "held-out", "tasks)"]
    assert out[1].split()[:3] == ["never", "accuracy", "0.000"]
    assert out[2].split()[:3] == ["mean", "accuracy", "0.250"]

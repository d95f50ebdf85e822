"""The context budget: each environment's first prompt, by part, against the knobs; a
config whose first prompt cannot fit is refused in one line by plan, check-env and train."""

from __future__ import annotations

import asyncio
import re

import pytest

from agentrl.cli import main
from agentrl.config import CompactionConfig, ConfigError, RolloutConfig, config_from_dict
from agentrl.envs.context_budget import budget_problem, measure_first_prompt
from agentrl.envs.registry import make
from agentrl.model.tiny import tiny_tokenizer
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.train.preflight_facts import Preflight
from agentrl.train.preflight_sizes import check_context_budget
from tests.rollout.stand_ins import RecordingEngine, ScriptedEngine


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(0)


def config(budget: int, strategy: str = "drop_oldest", **env) -> object:
    return config_from_dict({
        "environments": [{"id": "agentrl/Calculator-v0", "name": "calc", **env},
                         {"id": "agentrl/Countdown-v0", "name": "countdown"}],
        "batch": {"rollout_batch_size": 2, "global_batch_size": 8},
        "rollout": {"max_new_tokens": 40},
        "compaction": {"strategy": strategy, "max_context_tokens": budget}})


def test_the_parts_add_up_to_the_prompt_the_engine_receives(tokenizer):
    env = make("agentrl/Calculator-v0")
    budget = measure_first_prompt(env, tokenizer, "calc", num_tasks=1)
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda p, s: "12"))
    spec = RolloutSpec("r", "g", "calc", task_seed=0)
    asyncio.run(play_rollout(spec, make("agentrl/Calculator-v0"), engine, tokenizer,
                             RolloutConfig(), CompactionConfig()))
    assert budget.total == len(engine.prompts[0])
    assert min(budget.system_tokens, budget.tool_tokens, budget.observation_tokens) > 0


def test_tool_schemas_cost_only_the_tool_part(tokenizer):
    countdown = measure_first_prompt(make("agentrl/Countdown-v0"), tokenizer, "c")
    assert countdown.tool_tokens == 0  # no tools
    calc = measure_first_prompt(make("agentrl/Calculator-v0"), tokenizer, "calc")
    # the calculate tool's schema: name, description and parameter render to many tokens
    assert calc.tool_tokens > 100


def test_the_longest_task_counts(tokenizer):
    from agentrl.rollout.context import ChatContext

    env = make("agentrl/Calculator-v0", num_operations=3)  # stories of varying length
    lengths = [len(ChatContext(tokenizer, env.tool_schemas(), env.reset(seed=s)[0])
                   .prompt_ids()) for s in range(8)]
    assert len(set(lengths)) > 1
    assert measure_first_prompt(env, tokenizer, "calc", num_tasks=8).total == max(lengths)


def test_a_first_prompt_over_the_budget_is_refused_in_one_line():
    # plan's check, with the tiny built-in tokenizer (no model.path)
    calc = Preflight(config(100_000)).prompt_budget(0)
    total = calc.total
    assert budget_problem(calc, config(total)) is None  # exactly at the budget: fits
    with pytest.raises(ConfigError) as caught:
        check_context_budget(Preflight(config(total - 1)))
    message = str(caught.value)
    assert "\n" not in message
    assert f"'calc': its first prompt is {total} tokens" in message
    assert f"compaction.max_context_tokens = {total - 1}" in message
    assert f"at least {total + 40}" in message  # the prompt plus one turn of 40
    # without compaction there is no context budget to refuse
    assert check_context_budget(Preflight(config(total - 1, strategy="none")))


def test_plan_prints_every_environment_and_refuses_over_budget(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[[environments]]\nid = "agentrl/Calculator-v0"\nname = "calc"\n\n'
                    '[[environments]]\nid = "agentrl/Countdown-v0"\n\n'
                    "[batch]\nrollout_batch_size = 2\nglobal_batch_size = 8\n"
                    '[compaction]\nstrategy = "drop_oldest"\nmax_context_tokens = 2000\n')
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    part = r"system \d+ \+ tools \d+ \+ first observation \d+ = \d+ tokens"
    assert re.search(r"\n  calc +" + part, out)
    assert re.search(r"\n  Countdown-v0 +system \d+ \+ tools 0 \+", out)
    assert "of compaction.max_context_tokens 2000:" in out and "tiny built-in" in out
    assert main(["plan", str(path), "--set", "compaction.max_context_tokens=300"]) == 2
    captured = capsys.readouterr()
    assert "OVER by" in captured.out and "error: environment 'calc'" in captured.err


def test_plan_uses_the_configured_model_tokenizer():
    cfg = config_from_dict({"environments": [{"id": "agentrl/Countdown-v0"}],
                            "model": {"path": "assets/quickstart-sft"}})
    from agentrl.model import load_tokenizer

    preflight = Preflight(cfg)
    tokenizer, name = preflight.tokenizer, preflight.tokenizer_name
    shipped = load_tokenizer("assets/quickstart-sft")
    assert name.endswith("quickstart-sft") and tokenizer.vocab_size == shipped.vocab_size
    text = "Numbers: 3, 4\nTarget: 12"
    assert tokenizer.encode(text) == shipped.encode(text) != tiny_tokenizer(0).encode(text)


def test_check_env_prints_the_budget_and_refuses_with_a_config(tmp_path, capsys):
    assert main(["check-env", "agentrl/Countdown-v0"]) == 0
    assert "first observation" in capsys.readouterr().out
    path = tmp_path / "c.toml"
    path.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n'
                    '[compaction]\nstrategy = "drop_oldest"\nmax_context_tokens = 100\n')
    assert main(["check-env", "agentrl/Calculator-v0", "--config", str(path)]) == 1
    assert "error: environment 'Calculator-v0'" in capsys.readouterr().out


def test_train_refuses_before_the_first_step(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[[environments]]\nid = "agentrl/Calculator-v0"\n'
                    "[batch]\nrollout_batch_size = 1\nglobal_batch_size = 4\n"
                    '[compaction]\nstrategy = "drop_oldest"\nmax_context_tokens = 60\n'
                    '[model]\npath = "assets/quickstart-sft"\n[log]\nlive = false\n')
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "error: environment 'Calculator-v0'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

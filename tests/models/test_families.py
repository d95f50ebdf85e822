"""Every supported model family, as a tiny checkpoint with its real chat template: what
the template does to multi-turn rows, multi-turn tool rollouts token-exact with tool
calls round-tripping through the family's parser and ``format_call``, and a config
pointing at the checkpoint that plans, collects and trains a step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.envs import Grade, Task
from agentrl.envs.parsers import adopt_tool_format
from agentrl.model import load_tokenizer
from agentrl.rollout.chat_style import ChatStyle
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.rollout.template_check import prepare_chat
from agentrl.types import Message
from tests.models.families import FAMILIES, AddToolEnv, build_family_checkpoint
from tests.models.rows import assert_rows_hold_engine_tokens
from tests.rollout.stand_ins import RecordingEngine, ScriptedEngine

EVERY_TURN = ["a tool call", "reasoning before a tool call",
              "a new user message after reasoning", "a reply with a trailing space"]
FINDINGS = {
    "qwen2.5": (False, {}),
    "qwen3": (False, {"a new user message after reasoning": "reasoning_dropped"}),
    "llama3.1": (False, {"a reply with a trailing space": "trimmed"}),
    "mistral": (True, dict.fromkeys(EVERY_TURN, "rewritten")),
    "gpt-oss": (True, dict.fromkeys(EVERY_TURN, "rewritten")),
    "deepseek-v3": (False, {}),
}
"""Per family: calls go to the template as tool_calls; the scripted turns it re-renders
(docs/models.md's table says the same)."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_family_checkpoint(root / name, name) for name in FAMILIES}


def tokenizer_of(checkpoints: dict[str, Path], name: str):
    tokenizer = load_tokenizer(checkpoints[name])
    prepare_chat(tokenizer)
    return tokenizer


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_template_is_classified_at_load_time(checkpoints, name):
    finding = prepare_chat(load_tokenizer(checkpoints[name]))
    structured, rewrites = FINDINGS[name]
    assert finding.error is None
    assert finding.style.tool_format == FAMILIES[name].tool_format
    assert finding.style.structured == structured
    assert dict(finding.rewrites) == rewrites
    assert ("appends every turn" in finding.describe()) == (not rewrites)


class AddEnv(AddToolEnv):
    """Add two numbers with the tool, twice, then answer "done"."""

    max_turns = 4

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task([Message("system", "Use the tools."), Message("user", "Add twice.")],
                    key="t")

    def grade(self, answer: str) -> float:
        return float(answer.strip() == "done")

    def demonstrate(self, messages: list[Message]) -> str | None:
        calls = sum(m.role == "tool" for m in messages)
        return self.format_call("add", a=2 + calls, b=3) if calls < 2 else "done"


def play_family(tokenizer, reasoning: str = "", suffix: str = ""):
    """One scripted rollout of AddEnv in the family's format; the env's own demonstrate
    is the policy (its format_call is the model's format)."""
    env = adopt_tool_format(AddEnv(), tokenizer.chat_style.tool_format)
    probe = adopt_tool_format(AddEnv(), tokenizer.chat_style.tool_format)
    probe.reset(seed=0)
    replies = []

    def policy(prompt, params):
        reply = probe.demonstrate(list(probe.history))
        probe.step(reply)
        replies.append(reply)
        return reasoning + reply + suffix

    engine = RecordingEngine(ScriptedEngine(tokenizer, policy))
    rollout = asyncio.run(play_rollout(RolloutSpec("r0", "g0", "add", task_seed=0), env,
                                       engine, tokenizer, RolloutConfig(max_new_tokens=200),
                                       CompactionConfig()))
    return rollout, engine, replies


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_multi_turn_tool_rollouts_hold_the_engines_tokens(checkpoints, name):
    tokenizer = tokenizer_of(checkpoints, name)
    rollout, engine, replies = play_family(tokenizer)
    assert rollout.valid and rollout.reward == 1.0, rollout.stats.error
    assert rollout.stats.tool_errors == {}  # both calls parsed and ran: 5, then 6
    assert replies[-1] == "done" and len(replies) == 3
    per_row = assert_rows_hold_engine_tokens(rollout.segments, engine.prompts,
                                             engine.generations)
    boundaries = [c for c in rollout.stats.compactions if c.cause == "template"]
    structured, _ = FINDINGS[name]
    # a template given calls as tool_calls re-renders each call turn; the others append
    assert len(boundaries) == (2 if structured else 0)
    assert sum(per_row) == 3 and len(per_row) == 1 + len(boundaries)
    last_prompt = tokenizer.decode(engine.prompts[-1])
    assert "5" in last_prompt and "6" in last_prompt  # both tool results reached the model


def test_qwen3_keeps_reasoning_in_the_trained_row_within_a_tool_loop(checkpoints):
    tokenizer = tokenizer_of(checkpoints, "qwen3")
    rollout, engine, _ = play_family(tokenizer, reasoning="<think>\nAdd.\n</think>\n\n")
    assert rollout.valid and len(rollout.segments) == 1  # the tool loop appends
    row = rollout.segments[0]
    trained = tokenizer.decode([t for t, m in zip(row.token_ids, row.loss_mask, strict=True)
                                if m])
    assert trained.count("<think>\nAdd.\n</think>") == 3
    assert_rows_hold_engine_tokens(rollout.segments, engine.prompts, engine.generations)


def test_a_template_that_refuses_the_conversation_invalidates_the_rollout_not_the_run(
        checkpoints):
    tokenizer = load_tokenizer(checkpoints["gpt-oss"])
    tokenizer.chat_style = ChatStyle("harmony", structured=False)  # tool messages as text
    rollout, _, _ = play_family(tokenizer)
    assert not rollout.valid and rollout.stats.error_kind == "chat_template_raised"
    assert "no previous assistant message with a tool call" in rollout.stats.error


CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 2
global_batch_size = 4
[rollout]
max_new_tokens = 8
max_turns = 3
[train]
num_steps = 1
eval_every = 0
checkpoint_every = 0
seed = 1
[log]
live = false
[[environments]]
id = "tests.models.test_families:NudgeEnv"
"""


class NudgeEnv(AddToolEnv):
    """A random model rarely calls a tool: a reply without a call gets one user nudge, so
    every rollout is multi-turn; the reward is the reply's length parity (mixed)."""

    max_turns = 3

    def sample_task(self, rng: np.random.Generator) -> Task:
        self.nudged = False
        number = int(rng.integers(100))
        return Task([Message("user", f"Add {number} and 1.")], key=str(number))

    def step(self, action: str):
        if not self.nudged and not self.parser.parse(action):
            self.nudged = True
            return ([Message("user", "Use the add tool.")], 0.0, False, False,
                    {"tool_errors": {}, "reward_components": {}})
        return super().step(action)

    def grade(self, answer: str) -> Grade:
        return Grade(float(len(answer) % 2))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_config_of_each_family_plans_collects_and_trains_a_step(checkpoints, tmp_path,
                                                                  capsys, name):
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(model=checkpoints[name]))
    assert main(["plan", str(config)]) == 0
    assert f"tool calls: {FAMILIES[name].tool_format}" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["train", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "chat template:" in printed
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["num_trainable_tokens"] > 0
    assert step.get("invalid/chat_template_raised", 0) == 0
    assert step["num_turns/mean"] >= 2  # every rollout was multi-turn


def test_training_and_validation_build_environments_in_the_models_format(checkpoints):
    import pickle

    from agentrl.config import Config, EnvironmentConfig
    from agentrl.rollout.evaluation import make_eval_env
    from agentrl.rollout.runner import RolloutRunner

    tokenizer = tokenizer_of(checkpoints, "llama3.1")
    env_config = EnvironmentConfig(id="tests.models.test_families:AddEnv")
    config = Config(environments=[env_config])
    runner = RolloutRunner(config, engine=None, tokenizer=tokenizer, sampler=None)
    factory = runner._source(env_config).factory
    assert pickle.loads(pickle.dumps(factory))().parser.name == "llama3_json"  # a worker's
    assert make_eval_env(env_config, "llama3_json").parser.name == "llama3_json"
    explicit = EnvironmentConfig(id="tests.models.test_families:AddEnv",
                                 kwargs={"parser": "hermes"})
    kept = RolloutRunner(Config(environments=[explicit]), None, tokenizer, None)
    assert kept._source(explicit).factory().parser.name == "hermes"  # its own parser stays


def test_qwen3_without_thinking_starts_a_row_every_turn(checkpoints):
    """enable_thinking = false puts an empty think block in each generation prompt, and
    the template leaves it out of the history it re-renders: every turn is a boundary."""
    from agentrl.config import ModelConfig

    tokenizer = load_tokenizer(checkpoints["qwen3"])
    finding = prepare_chat(tokenizer, ModelConfig(chat_template_kwargs={"enable_thinking": False}))
    assert dict(finding.rewrites) == dict.fromkeys(EVERY_TURN, "reasoning_dropped")
    rollout, engine, _ = play_family(tokenizer)
    assert rollout.valid and rollout.reward == 1.0
    assert assert_rows_hold_engine_tokens(rollout.segments, engine.prompts,
                                          engine.generations) == [1, 1, 1]
    assert all(tokenizer.decode(p).endswith("<think>\n\n</think>\n\n") for p in engine.prompts)


def test_llama_replies_the_template_trims_become_boundaries_where_it_trims(checkpoints):
    tokenizer = tokenizer_of(checkpoints, "llama3.1")
    rollout, engine, _ = play_family(tokenizer, suffix=" ")
    assert rollout.valid and rollout.reward == 1.0 and rollout.stats.tool_errors == {}
    assert [(c.cause, c.strategy, c.segment) for c in rollout.stats.compactions] == [
        ("template", "trimmed", 0), ("template", "trimmed", 1)]
    assert assert_rows_hold_engine_tokens(rollout.segments, engine.prompts,
                                          engine.generations) == [1, 1, 1]
    second = rollout.segments[1]
    prompt = tokenizer.decode(second.token_ids[:second.num_prompt_tokens])
    assert '"b": 3}}<|eot_id|>' in prompt  # the history as the template renders it


def test_a_turn_ends_at_every_end_of_turn_id_of_the_generation_config(checkpoints, tmp_path):
    """gpt-oss ends a tool call with <|call|>, Llama 3 an ipython call with <|eom_id|>:
    the checkpoint's generation_config.json lists them beside EOS."""
    import shutil

    from agentrl.rollout.multi_turn import RolloutPlayer

    folder = shutil.copytree(checkpoints["gpt-oss"], tmp_path / "gpt-oss")
    tokenizer = load_tokenizer(folder)
    ids = [tokenizer.token_to_id(t) for t in ("<|return|>", "<|endoftext|>", "<|call|>")]
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(
        {**config, "eos_token_id": [ids[1], ids[0], ids[2]]}))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.stop_token_ids == tuple(ids)  # EOS first
    player = RolloutPlayer(RolloutSpec("r", "g", "e", 0), AddEnv(), None, tokenizer,
                           RolloutConfig(), CompactionConfig())
    assert player.stop_ids == tuple(ids)


@pytest.mark.parametrize("name", ["mistral", "gpt-oss"])
def test_a_malformed_call_is_answered_not_refused_by_templates_that_want_call_ids(
        checkpoints, name):
    """The error for a call that could not be read answers no call id: it reaches the
    template as a user message, so the rollout goes on (a trained outcome, not masked)."""
    from tests.models.tool_call_corpus import CORPUS

    tokenizer = tokenizer_of(checkpoints, name)
    bad = next(text for text, _, errors in CORPUS[FAMILIES[name].tool_format] if errors)
    env = adopt_tool_format(AddEnv(), tokenizer.chat_style.tool_format)
    replies = iter([bad, env.format_call("add", a=2, b=3), env.format_call("add", a=3, b=3),
                    "done"])
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda prompt, params: next(replies)))
    rollout = asyncio.run(play_rollout(RolloutSpec("r0", "g0", "add", task_seed=0), env,
                                       engine, tokenizer, RolloutConfig(max_new_tokens=200),
                                       CompactionConfig()))
    assert rollout.valid and rollout.reward == 1.0, rollout.stats.error
    assert sum(rollout.stats.tool_errors.values()) == 1
    assert_rows_hold_engine_tokens(rollout.segments, engine.prompts, engine.generations)

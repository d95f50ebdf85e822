"""Demonstrations for every environment: the demonstrate() hook or a JSONL of trajectories,
each environment in its weight's share, played through the runner (compaction included),
and a loud refusal naming both fixes when an environment has neither."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.config import ConfigError, config_from_dict
from agentrl.envs import AgentEnv, Grade, Task
from agentrl.envs.demonstrations import demonstration_policies, load_trajectories
from agentrl.rollout.demonstrations import play_demonstrations
from agentrl.types import Message

LOGSEARCH = "examples/logsearch/logsearch.py:LogSearchEnv"
SECRET = "tests.train.test_demonstrations:SecretWordEnv"


class SecretWordEnv(AgentEnv):
    """Say the task's word; no scripted policy (demonstrations come from a file)."""

    def sample_task(self, rng: np.random.Generator) -> Task:
        word = str(rng.choice(["alpha", "bravo", "delta", "kilo", "lima", "oscar"]))
        return Task([Message("user", f"Say {word}.")], answer=word, key=word)

    def grade(self, answer: str) -> Grade:
        return Grade(float(answer.strip() == self.task.answer))


class BrokenPolicyEnv(SecretWordEnv):
    """A scripted policy with a bug."""

    def demonstrate(self, messages: list[Message]) -> str:
        return {}["missing"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from agentrl.model import build_tiny_checkpoint, load_tokenizer

    return load_tokenizer(build_tiny_checkpoint(tmp_path_factory.mktemp("tok") / "m",
                                                hidden_size=32, vocab_size=400))


def config(*envs: dict, **sections) -> object:
    n = len(envs) * 4
    return config_from_dict({"environments": list(envs),
                             "batch": {"rollout_batch_size": n, "n_samples_per_prompt": 1,
                                       "global_batch_size": n}, **sections})


def play(cfg, tokenizer, n, **kwargs):
    lines: list[str] = []
    rollouts = asyncio.run(play_demonstrations(cfg, tokenizer, n, seed=0, log=lines.append,
                                               **kwargs))
    return rollouts, "\n".join(lines)


def test_an_environment_without_demonstrations_is_refused_naming_both_fixes():
    cfg = config({"id": "agentrl/Countdown-v0"}, {"id": SECRET, "name": "secret"})
    with pytest.raises(ConfigError) as caught:
        demonstration_policies(cfg)
    message = str(caught.value)
    assert "'secret'" in message and SECRET in message
    assert "def demonstrate(self, messages)" in message and "--demonstrations" in message


def test_the_sft_command_refuses_before_any_work(tmp_path, capsys):
    path = tmp_path / "mix.toml"
    path.write_text(f'[[environments]]\nid = "agentrl/Countdown-v0"\n\n'
                    f'[[environments]]\nid = "{SECRET}"\nname = "secret"\n'
                    "[batch]\nrollout_batch_size = 2\nglobal_batch_size = 8\n")
    assert main(["sft", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "environment 'secret'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_environment_gets_its_weight_share_through_the_multi_turn_loop(tokenizer):
    cfg = config({"id": LOGSEARCH, "name": "logsearch", "weight": 3.0},
                 {"id": "agentrl/Countdown-v0", "name": "countdown",
                  "kwargs": {"num_numbers": 2, "max_number": 9}},
                 rollout={"max_new_tokens": 64})
    rollouts, report = play(cfg, tokenizer, 16)
    assert Counter(r.env for r in rollouts) == {"logsearch": 12, "countdown": 4}
    assert all(r.reward == 1.0 for r in rollouts)
    # grep, read, answer: three turns, tool calls rendered by the chat template
    logsearch = [r for r in rollouts if r.env == "logsearch"]
    assert all(r.stats.num_turns == 3 for r in logsearch)
    text = tokenizer.decode(logsearch[0].segments[0].token_ids)
    assert "<tool_response>" in text and '"name": "read"' in text
    assert "logsearch: 12 played, 12 correct" in report
    assert "countdown: 4 played, 4 correct" in report


def test_demonstrations_are_compacted_like_training_rollouts(tokenizer):
    cfg = config({"id": "agentrl/KVStore-v0", "name": "kv",
                  "kwargs": {"chain_length": 4, "padding_words": 6}},
                 rollout={"max_new_tokens": 64},
                 compaction={"strategy": "drop_oldest", "max_context_tokens": 760,
                             "keep_last_turns": 1})
    rollouts, _ = play(cfg, tokenizer, 4)
    assert len(rollouts) == 4 and all(r.reward == 1.0 for r in rollouts)
    assert all(r.stats.num_compactions >= 3 and len(r.segments) >= 4 for r in rollouts)
    later = tokenizer.decode(rollouts[0].segments[-1].token_ids)
    assert "earlier turn(s) were removed" in later  # the compacted context was trained on


def test_a_summarizing_warm_start_needs_the_environments_summaries(tokenizer):
    cfg = config({"id": "agentrl/KVStore-v0", "name": "kv"},
                 compaction={"strategy": "summarize", "max_context_tokens": 760})
    with pytest.raises(ConfigError, match=r"demonstrate_summary\(messages, forced=True\)"):
        play(cfg, tokenizer, 4)


@pytest.mark.parametrize("strategy", ["summarize", "tool"])
def test_summaries_are_demonstrated_and_keep_every_entry(tokenizer, strategy):
    """Ledger's scripted summaries (asked for by the budget, or written into compact calls)
    carry every entry seen so far; the summary tokens are trained (loss mask 1)."""
    cfg = config({"id": "agentrl/Ledger-v0", "name": "ledger",
                  "kwargs": {"num_pages": 6, "num_facts": 3, "filler_words": 6}},
                 rollout={"max_new_tokens": 96, "max_turns": 30, "max_rollout_tokens": 4000},
                 compaction={"strategy": strategy, "max_context_tokens": 800,
                             "keep_last_turns": 0, "max_compactions": 12,
                             "summary_max_tokens": 96})
    rollouts, _ = play(cfg, tokenizer, 3)
    assert len(rollouts) == 3 and all(r.reward == 1.0 for r in rollouts)
    for rollout in rollouts:
        compactions = rollout.stats.compactions
        assert compactions and all(c.facts_kept == c.facts_revealed for c in compactions)
        if strategy == "tool":
            assert {c.cause for c in compactions} >= {"tool"}
        else:
            assert {c.cause for c in compactions} == {"budget"}
        summaries = [c.summary for c in compactions]
        assert all(s.startswith("Kept: ") for s in summaries)
        trained = "".join(tokenizer.decode([t for t, m in zip(s.token_ids, s.loss_mask,
                                                                strict=True) if m])
                          for s in rollout.segments)
        assert all(s in trained for s in summaries)


def test_a_jsonl_of_trajectories_demonstrates_an_environment_without_a_policy(
        tmp_path, tokenizer):
    from agentrl.envs.registry import make

    env, seeds = make(SECRET), {}
    for seed in range(40):  # a seed per word, as a user recording episodes would have
        env.reset(seed=seed)
        seeds.setdefault(env.task.answer, seed)
    words = sorted(seeds)[:3]
    lines = [{"env": "secret", "seed": seeds[w], "actions": [w]} for w in words[:2]]
    lines.append({"env": "secret", "seed": seeds[words[2]], "actions": ["wrong"]})
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    cfg = config({"id": SECRET, "name": "secret"},
                 {"id": "agentrl/Countdown-v0", "kwargs": {"num_numbers": 2}})
    policies = demonstration_policies(cfg, load_trajectories([path]))
    rollouts, report = play(cfg, tokenizer, 12, policies=policies)
    secret = [r for r in rollouts if r.env == "secret"]
    # 6 of 12 by weight; the file's three tasks in turn: the two right ones are kept
    assert len(secret) == 4 and all(r.reward == 1.0 for r in secret)
    said = {tokenizer.decode(r.segments[0].token_ids).split("assistant\n")[-1] for r in secret}
    assert {s.removesuffix("<|im_end|>") for s in said} == set(words[:2])
    assert "secret: 6 played, 4 correct; 2 left out, the first because the environment " \
           "graded it 0" in report


def test_bad_trajectory_files_name_the_file_and_line(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text('{"env": "secret", "seed": 1, "actions": ["a"]}\n{"env": "secret"}\n')
    with pytest.raises(ConfigError, match=r"demos.jsonl:2: .*seed"):
        load_trajectories([path])
    path.write_text('{"env": "nope", "seed": 1, "actions": ["a"]}\n')
    cfg = config({"id": SECRET, "name": "secret"})
    with pytest.raises(ConfigError, match=r"\['nope'\].*\['secret'\]"):
        demonstration_policies(cfg, load_trajectories([path]))


def test_a_failing_policy_is_reported_not_swallowed(tokenizer):
    cfg = config({"id": "tests.train.test_demonstrations:BrokenPolicyEnv", "name": "broken"})
    with pytest.raises(ConfigError, match=r"'broken': none of its 4 .*raised KeyError"):
        play(cfg, tokenizer, 4)


def test_a_demonstration_longer_than_a_turn_names_the_knob(tokenizer):
    cfg = config({"id": LOGSEARCH, "name": "logsearch"}, rollout={"max_new_tokens": 8})
    with pytest.raises(ConfigError, match=r"over the 7 a turn allows; raise "
                                          r"rollout.max_new_tokens"):
        play(cfg, tokenizer, 4)

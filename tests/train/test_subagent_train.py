"""`agentrl train` on rollout trees: every rollout delegates to two subagents, whose rows
train with the rollout's one advantage; the knobs and the lr schedule count rollouts and
updates (never threads or rows), synchronously and with in-flight weight updates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.config.schedule import lr_factor
from agentrl.envs import AgentEnv, Task, format_call, subagent
from agentrl.model import build_tiny_checkpoint
from agentrl.types import Message

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2          # groups per collection
n_samples_per_prompt = 4        # 8 rollouts (8 trees) per collection
global_batch_size = 4           # rollouts per update: 2 updates per collection
[rollout]
max_new_tokens = 8
max_turns = 3
max_subagent_tokens = 24
max_concurrent_rollouts = 8
[optim]
lr = 1e-2
warmup_steps = 3
[train]
num_steps = 2
seed = 1
[log]
live = false
[[environments]]
id = "tests.train.test_subagent_train:DelegatingEnv"
name = "delegating"
"""


class DelegatingEnv(AgentEnv):
    """Whatever the model writes first, the main thread asks two helpers (the second reads
    a note before it answers); the second reply ends the rollout, rewarded by its length's
    parity so a group's rewards differ."""

    max_turns = 3

    @subagent(system="You help.")
    def helper(self, part: int) -> str:
        """A helper for one part.

        Args:
            part: Which part.
        """
        return f"Do part {part}."

    def sample_task(self, rng: np.random.Generator) -> Task:
        number = int(rng.integers(1000))
        return Task([Message("user", f"Task {number}.")], key=str(number))

    def grade(self, answer: str) -> float:
        return float(len(answer) % 2)

    def step(self, action: str):
        if self._turn == 0:  # the first turn always delegates
            action = format_call("helper", part=0) + format_call("helper", part=1)
        return super().step(action)

    def thread_step(self, thread_id: str, action: str):
        state = self.threads.state(thread_id)
        if thread_id == "2" and state.turn == 0:
            state.turn += 1
            state.history.append(Message("assistant", action))
            note = [Message("tool", "a note " * 10, "note")]
            state.history.extend(note)
            return note, 0.0, False, False, {}
        return super().thread_step(thread_id, "answer " + action)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


@pytest.mark.parametrize("overrides", [[], ["rollout.max_staleness=1",
                                            "rollout.inflight_updates=true"]],
                         ids=["sync", "inflight"])
def test_trees_train_as_rollouts(tmp_path, model_dir, overrides) -> None:
    config = tmp_path / "tree.toml"
    config.write_text(CONFIG.format(model=model_dir))
    out = tmp_path / "run"
    argv = ["train", str(config), "--out", str(out)]
    assert main(argv + [a for o in overrides for a in ("--set", o)]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for step, m in enumerate(metrics, start=1):
        assert m["num_rollouts"] == 8 and m["num_groups"] == 2  # knobs count rollouts
        assert m["env/delegating/subagents/threads_per_rollout/mean"] == 3.0
        assert m["subagents/depth/max"] == 1.0
        # main 1 row + helper 1 + helper 1 (it read a note in its own context)
        assert m["num_rows"] == 8 * 3 and m["rows_per_rollout/mean"] == 3.0
        assert 0 < m["subagents/generated_token_share"] < 1
        assert m["cumulative/updates"] == 2 * step  # two updates per collection
        # the lr schedule advanced once per update: update 2·step - 1 was the last
        assert m["optim/lr"] == pytest.approx(1e-2 * lr_factor(2 * step - 1, 3))
        assert m["num_invalid_rollouts"] == 0
        if overrides:
            assert m["staleness/max"] <= 1  # none dropped: it raises
    sampled = [json.loads(line) for line in
               (out / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    tree = sampled[0]
    assert [t["thread_id"] for t in tree["threads"]] == ["1", "2"]
    assert [r.get("thread", "main") for r in tree["rows"]] == ["main", "1", "2"]
    assert len({r["advantage"] for r in tree["rows"]}) == 1  # one advantage, every thread
    trained = [json.loads(line) for line in (out / "trained_rollouts.jsonl").read_text()
               .splitlines()]
    assert sum(len(t["rollouts"]) for t in trained) == 16  # each rollout trained once

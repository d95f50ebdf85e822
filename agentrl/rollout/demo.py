"""A small batch with compacted rollouts, collected by the tiny model (``inspect --demo``).

The environment is scripted: each turn returns a bulky observation, so contexts outgrow a
small budget and get compacted. A reply whose character codes sum to a multiple of 4
counts as the answer: the episode ends with reward 1.0; after ``horizon`` turns without
one it ends with 0.0. So rollouts of a group differ in length (and in rows) and reward.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from agentrl.types import Message, Rollout


class ScriptedLongEnv:
    """Long-horizon stand-in environment: ``horizon`` turns of bulky observations."""

    def __init__(self, horizon: int = 4, obs_chars: int = 120) -> None:
        self.horizon = horizon
        self.obs_chars = obs_chars
        self.turn = 0
        self.seed: int | None = None

    def tool_schemas(self) -> list[dict]:
        """No tools: observations arrive as user messages."""
        return []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """The task: survive ``horizon`` turns."""
        self.seed, self.turn = seed, 0
        task = f"Task {seed}: read {self.horizon} reports, then answer."
        return [Message("system", "You are a careful agent."), Message("user", task)], {}

    def step(self, action: str):
        """A bulky report each turn; reward 1.0 for an "answer", 0.0 at the horizon."""
        self.turn += 1
        if sum(map(ord, action)) % 4 == 0:
            return [], 1.0, True, False, {}
        if self.turn >= self.horizon:
            return [], 0.0, True, False, {}
        report = f"report {self.turn}: " + ("data " * self.obs_chars)[: self.obs_chars]
        return [Message("user", report)], 0.0, False, False, {}


def collect_demo_batch(
    num_groups: int = 2, group_size: int = 4, max_context_tokens: int = 240, seed: int = 0,
    checkpoint: str | Path | None = None,
) -> list[Rollout]:
    """Collect one small batch with the tiny model and drop_oldest compaction."""
    from agentrl.config import config_from_dict
    from agentrl.engines.torch_engine import TorchEngine
    from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
    from agentrl.rollout.runner import RolloutRunner
    from agentrl.sampler import EnvironmentSampler

    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint or build_tiny_checkpoint(Path(tmp) / "tiny", hidden_size=32,
                                                   vocab_size=400, seed=seed)
        model = load_pretrained(path, attention="torch").eval()
        tokenizer = load_tokenizer(path)
    config = config_from_dict({
        "environments": [{"id": "demo:ScriptedLongEnv", "name": "scripted-long"}],
        "batch": {"rollout_batch_size": num_groups, "n_samples_per_prompt": group_size,
                  "global_batch_size": num_groups * group_size},
        "rollout": {"max_new_tokens": 8, "max_turns": 8, "temperature": 1.0},
        "compaction": {"strategy": "drop_oldest", "max_context_tokens": max_context_tokens,
                       "keep_last_turns": 1, "max_compactions": 8},
    })
    engine = TorchEngine(model, tokenizer, max_batch_size=num_groups * group_size,
                         max_len=max_context_tokens + 256)
    sampler = EnvironmentSampler({"scripted-long": 1.0}, seed=seed)

    def make_env(_: Any) -> ScriptedLongEnv:
        return ScriptedLongEnv()

    runner = RolloutRunner(config, engine, tokenizer, sampler, make_env=make_env)
    result = asyncio.run(runner.collect(step=0, num_rollouts_needed=num_groups * group_size))
    return result.rollouts

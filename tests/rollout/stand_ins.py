"""Scripted and recording engines, and small environments, for runner tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentrl.engines.interface import Generation, SamplingParams
from agentrl.types import Message

# ----------------------------------------------------------------------------- engines


class ScriptedEngine:
    """Replies with text chosen by ``policy(prompt_ids, params)``; records every call."""

    def __init__(self, tokenizer: Any, policy: Callable[[list[int], SamplingParams], str],
                 end: bool = True) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.end = end
        self.prompts: list[list[int]] = []
        self.generations: list[Generation] = []

    weight_version = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        await asyncio.sleep(0)
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.policy(prompt_ids, params))[: params.max_tokens]
        if self.end and len(ids) < params.max_tokens:
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
        logprobs = [-0.01 * (k + 1) for k in range(len(ids))]
        gen = Generation(ids, logprobs, reason)
        self.generations.append(gen)
        return gen

    def update_weights(self, named_tensors: Any, version: int | None = None) -> None:
        pass


class RecordingEngine:
    """Wraps an engine and records every prompt it received and what it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.keys: list[str | None] = []
        self.generations: list[Generation] = []

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        self.prompts.append(list(prompt_ids))
        self.keys.append(key)
        gen = await self.inner.generate(prompt_ids, params, key=key)
        self.generations.append(gen)
        return gen

    def update_weights(self, named_tensors: Any, version: int | None = None) -> None:
        self.inner.update_weights(named_tensors, version)


# ----------------------------------------------------------------------------- environments


class LongEnv:
    """A long-horizon stand-in: each step returns a bulky tool result; after ``horizon``
    steps the episode ends with reward 1.0 when the last action says "win", else 0.0.

    ``fail_at`` makes step number k raise; ``delay_s`` makes every step sleep (timeouts).
    """

    def __init__(self, horizon: int = 4, obs_len: int = 40, fail_at: int | None = None,
                 delay_s: float = 0.0, reward: float | None = None) -> None:
        self.horizon = horizon
        self.obs_len = obs_len
        self.fail_at = fail_at
        self.delay_s = delay_s
        self.fixed_reward = reward
        self.turn = 0
        self.seed: int | None = None
        self.closed = False

    def tool_schemas(self) -> list[dict]:
        return [{"type": "function", "function": {"name": "probe", "parameters": {}}}]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.seed, self.turn = seed, 0
        return [Message("system", "You explore."),
                Message("user", f"Task {seed}: probe {self.horizon} times.")], {}

    def step(self, action: str):
        import time

        self.turn += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_at == self.turn:
            raise RuntimeError("tool crashed")
        info = {"tool_errors": {"timeout": 1} if "bad" in action else {},
                "reward_components": {}}
        if self.turn >= self.horizon:
            reward = self.fixed_reward if self.fixed_reward is not None else float(
                "win" in action)
            info["reward_components"] = {"win": reward}
            return [], reward, True, False, info
        text = f"probe {self.turn} of task {self.seed}: " + "o" * self.obs_len
        return [Message("tool", text, name="probe")], 0.0, False, False, info

    def close(self) -> None:
        self.closed = True

"""Scripted and recording engines, and small environments, for runner tests."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.rollout.engine import Generation, SamplingParams

# ----------------------------------------------------------------------------- engines


class ScriptedEngine:
    """Returns canned replies (token ids) in order, per prompt prefix-independent."""

    def __init__(self, tokenizer: Any, replies: list[str], end: bool = True) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.end = end
        self.calls: list[list[int]] = []
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0)
        self.calls.append(list(prompt_ids))
        text = self.replies[(len(self.calls) - 1) % len(self.replies)]
        ids = self.tokenizer.encode(text)[: params.max_tokens]
        if self.end and len(ids) < params.max_tokens:
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
        gen = Generation(ids, [-0.5] * len(ids), reason)
        self.generations.append(gen)
        return gen

    def update_weights(self, state_dict: dict) -> None:
        pass


class RecordingEngine:
    """Wraps an engine and records every prompt it received and what it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.prompts.append(list(prompt_ids))
        gen = await self.inner.generate(prompt_ids, params)
        self.generations.append(gen)
        return gen

    def update_weights(self, state_dict: dict) -> None:
        self.inner.update_weights(state_dict)

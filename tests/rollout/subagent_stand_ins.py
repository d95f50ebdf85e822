"""An archive environment with a subagent, and an engine that plays it from the prompt text.

``Archive``: the main thread delegates each shelf to a reader (``delegate(shelf)``), the
reader ``read``s its shelf and answers the book; the rollout is correct when the final
answer names every book. ``fail`` makes the readers' steps break the contract (raise,
hang, earn a reward). ``TextPolicyEngine`` decides every reply from the decoded prompt
alone, so it plays the archive in any isolation, and records what the router needs to
see: request keys, requests in flight, per-token versions.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import numpy as np

from agentrl.engines.interface import Generation, SamplingParams
from agentrl.envs import AgentEnv, Task, format_call, subagent, tool
from agentrl.types import Message

READER = "You read one shelf."


class Archive(AgentEnv):
    """Books on shelves; each shelf is read by a subagent (see module doc)."""

    max_turns = 4
    main_tools = ("delegate",)

    def __init__(self, num_shelves: int = 3, padding: int = 0, fail: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_shelves, self.padding, self.fail = num_shelves, padding, fail

    @tool
    def read(self, shelf: int) -> str:
        """Read a shelf.

        Args:
            shelf: The shelf.
        """
        return f"shelf {shelf} holds {self.task.answer[shelf]}" + " dust" * self.padding

    @subagent(system=READER, tools=("read", "delegate"))
    def delegate(self, shelf: int) -> str:
        """A reader finds the book on one shelf.

        Args:
            shelf: The shelf to read.
        """
        if not 0 <= shelf < self.num_shelves:
            raise ValueError(f"shelves are 0 to {self.num_shelves - 1}")
        return f"Which book is on shelf {shelf}?"

    def sample_task(self, rng: np.random.Generator) -> Task:
        books = [f"b{int(rng.integers(100, 1000))}" for _ in range(self.num_shelves)]
        return Task([Message("system", "Name every book."),
                     Message("user", f"There are {self.num_shelves} shelves.")],
                    books, key=" ".join(books))

    def grade(self, answer: str) -> float:
        return float(all(book in answer for book in self.task.answer))

    def demonstrate(self, messages: list[Message]) -> str:
        """The "good" policy on the thread's messages (for check-env and sft)."""
        tools = [m.content for m in messages if m.role == "tool"]
        if messages[0].content == READER:
            shelf = int(messages[1].content.split()[-1].rstrip("?"))
            return tools[-1].split()[3] if tools else format_call("read", shelf=shelf)
        if not tools:
            return "".join(format_call("delegate", shelf=s) for s in range(self.num_shelves))
        return "Books: " + " ".join(tools)

    def thread_step(self, thread_id: str, action: str):
        if self.fail == "raise":
            raise RuntimeError("the reader's lamp broke")
        if self.fail == "hang":
            time.sleep(3.0)
        result = super().thread_step(thread_id, action)
        if self.fail == "reward":
            return result[0], 1.0, *result[2:]
        return result


def archive_reply(prompt: str, mode: str = "good") -> str:
    """The scripted policy from the prompt alone (``mode``: "good", "loop" readers that
    never answer, "nest" readers that delegate again, "compact" readers that first call
    the ``compact`` tool, "extra" a main that asks for an invalid shelf too)."""
    answers = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
    if READER in prompt:
        shelf = re.findall(r"Which book is on shelf (\d+)", prompt)[-1]
        if mode == "nest" and not answers:
            return format_call("delegate", shelf=int(shelf))
        if mode == "compact" and f"noted shelf {shelf}" not in prompt:
            return format_call("compact", summary=f"noted shelf {shelf}")
        if mode == "loop" or not answers or answers[-1].startswith("Error"):
            return format_call("read", shelf=int(shelf))
        found = re.findall(r"\b(b\d+)\b", answers[-1])  # its shelf, or a helper's answer
        return found[0] if found else "unknown"
    if not answers:
        count = int(re.findall(r"There are (\d+) shelves", prompt)[0])
        shelves = [*range(count), -1] if mode == "extra" else range(count)
        return "".join(format_call("delegate", shelf=s) for s in shelves)
    return "Books: " + " ".join(answers)


class TextPolicyEngine:
    """An ``InferenceEngine`` replying ``archive_reply(decoded prompt)``; records keys,
    the most requests in flight at once, and stamps each token with ``weight_version``."""

    def __init__(self, tokenizer: Any, mode: str = "good", delay_s: float = 0.0,
                 hang_keys: bool = False, bump_versions: bool = False) -> None:
        self.tokenizer = tokenizer
        self.mode = mode
        self.delay_s = delay_s
        self.hang_keys = hang_keys
        self.bump_versions = bump_versions
        self.keys: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.weight_version = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        self.keys.append(key)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang_keys and key is not None and "#" in key:
                await asyncio.sleep(3600)  # a subagent that never finishes generating
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        text = archive_reply(self.tokenizer.decode(prompt_ids), self.mode)
        ids = self.tokenizer.encode(text)[: params.max_tokens - 1]
        ids.append(self.tokenizer.eos_token_id)
        versions = [self.weight_version] * len(ids)
        if self.bump_versions:
            self.weight_version += 1  # new weights after every request
        return Generation(ids, [-0.1] * len(ids), "stop", versions=versions)

    def update_weights(self, named_tensors: Any, version: int | None = None) -> None:
        """Nothing to update."""

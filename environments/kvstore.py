"""KVStore: a long-horizon chain of key lookups that deliberately outgrows a small context.

A generated key-value store hides a chain: the task names a start key; looking it up
(tool ``lookup``) gives ``next key: <key>``, and so on for ``chain_length`` lookups until
one gives ``final value: <number>``. The answer is that number (``<answer>N</answer>`` or
any reply whose last number is N). Every lookup result carries ``padding_words`` words of
filler notes, so a trace grows by roughly ``chain_length × padding_words`` tokens.

Only the latest observation is needed to act, so a context compacted down to its last
turn still allows the optimal policy: :func:`scripted_action` is that policy, offered as
the environment's ``demonstrate`` hook (``agentrl sft``, ``agentrl check-env``). Action
format for a lookup:
``<tool_call>{"name": "lookup", "arguments": {"key": "k3f9a1"}}</tool_call>``.
"""

from __future__ import annotations

import json
import re

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, tool
from agentrl.types import Message
from environments._verify import extract_number, last_tagged

SYSTEM = ("You explore a key-value store with the lookup tool. Follow the chain of keys "
          "until a value says 'final value', then reply <answer>that value</answer>.")
FILLER = ("archive", "ledger", "note", "index", "shelf", "record", "entry", "folder",
          "margin", "detail", "remark", "memo")
_START = re.compile(r"Start at key (k[0-9a-f]+)")
_NEXT = re.compile(r"next key: (k[0-9a-f]+)")
_FINAL = re.compile(r"final value: (\d+)")


def scripted_action(messages: list[Message]) -> str:
    """The optimal action given the messages so far (only the latest clue is needed)."""
    for message in reversed(messages):
        if message.role == "tool":
            if found := _FINAL.search(message.content):
                return f"<answer>{found.group(1)}</answer>"
            if found := _NEXT.search(message.content):
                return _lookup_call(found.group(1))
        if message.role == "user" and (found := _START.search(message.content)):
            return _lookup_call(found.group(1))
    return "<answer>0</answer>"


def _lookup_call(key: str) -> str:
    call = {"name": "lookup", "arguments": {"key": key}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


class KVStoreEnv(AgentEnv):
    """Follow ``chain_length`` lookups to the final value; reward 1.0 for the right value."""

    def __init__(self, chain_length: int = 8, num_distractors: int = 8,
                 padding_words: int = 40, max_turns: int | None = None, **kwargs):
        if chain_length < 1 or num_distractors < 0 or padding_words < 0:
            raise ValueError(f"kvstore: need chain_length >= 1, num_distractors >= 0 and "
                             f"padding_words >= 0; got {chain_length}, {num_distractors}, "
                             f"{padding_words}")
        super().__init__(max_turns=max_turns or chain_length + 2, **kwargs)
        self.chain_length, self.num_distractors = chain_length, num_distractors
        self.padding_words = padding_words
        self.store: dict[str, str] = {}

    @tool
    def lookup(self, key: str) -> str:
        """Read the value stored under a key.

        Args:
            key: The key to read, e.g. "k3f9a1".
        """
        if key not in self.store:
            raise KeyError(f"no key {key!r} in the store")
        return self.store[key]

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A fresh store: the chain, distractor keys, and padded values."""
        names = _unique_keys(rng, self.chain_length + self.num_distractors)
        chain, distractors = names[: self.chain_length], names[self.chain_length:]
        final = int(rng.integers(1000, 10_000))
        store = {}
        for i, key in enumerate(chain):
            clue = f"next key: {chain[i + 1]}" if i + 1 < len(chain) else f"final value: {final}"
            store[key] = f"{clue}\n{self._padding(rng)}"
        for key in distractors:
            store[key] = f"next key: {str(rng.choice(distractors))}\n{self._padding(rng)}"
        prompt = (f"Start at key {chain[0]}. Each value names the next key to look up; "
                  f"the chain has {self.chain_length} keys. Answer with the final value.")
        return Task([Message("system", SYSTEM), Message("user", prompt)],
                    answer={"final": final, "store": store}, key=f"{chain[0]}:{final}")

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a task and load its store for the lookup tool."""
        messages, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        self.store = dict(self.task.answer["store"])
        return messages, info

    def grade(self, answer: str) -> Grade:
        """1.0 when the answer is the chain's final value."""
        assert self.task is not None
        tagged = last_tagged(answer)
        number = extract_number(tagged if tagged is not None else answer)
        correct = float(number is not None and number == self.task.answer["final"])
        lookups = sum(1 for m in self.history if m.role == "tool" and m.name == "lookup")
        return Grade(correct, {"correct": correct, "lookups": float(lookups)})

    def demonstrate(self, messages: list[Message]) -> str:
        """The optimal policy's action (see the module docstring)."""
        return scripted_action(messages)

    def _padding(self, rng: np.random.Generator) -> str:
        if not self.padding_words:
            return ""
        return "notes: " + " ".join(str(w) for w in rng.choice(FILLER, self.padding_words))


def _unique_keys(rng: np.random.Generator, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = f"k{int(rng.integers(16**6)):06x}"
        if key not in keys:
            keys.append(key)
    return keys

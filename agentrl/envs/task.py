"""A task, a verifier's grade, and the split (train or eval) a task key belongs to."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from agentrl.types import Message

SPLITS = ("train", "eval")


class Task(msgspec.Struct):
    """One task: the opening messages, the ground truth for the verifier, and a key."""

    messages: list[Message]
    answer: Any = None
    """Whatever ``grade`` needs (a number, an expression's numbers and target, ...)."""
    key: str = ""
    """Canonical identity of the task; decides its split (train or eval)."""


class Grade(msgspec.Struct):
    """A verifier's verdict: the reward and its named components (for logging)."""

    reward: float
    components: dict[str, float] = {}


def split_of_key(key: str, eval_fraction: float) -> str:
    """The split a task key belongs to, by a stable hash (same on every machine and run)."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "eval" if digest / 2**64 < eval_fraction else "train"

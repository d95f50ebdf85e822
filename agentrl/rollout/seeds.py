"""Sampling seeds fixed by ids: a rollout's within its task, a subagent thread's within
its rollout. Reproducible, and independent of which other rollouts share the batch."""

from __future__ import annotations

import random


def derived_seed(seed: int, name: str) -> int:
    """A 31-bit sampling seed fixed by ``seed`` and the id ``name`` (one rule for every
    caller: the same pair always gives the same seed, different ids different ones)."""
    return random.Random(f"{seed}:{name}").getrandbits(31)

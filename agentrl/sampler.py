"""Environment-weighted sampling of groups: weights set each environment's share.

Every collection gives each environment ⌊n·w⌋ or ⌈n·w⌉ of its n groups. The extra
groups (n minus the floors) go to the environments with the largest remainders, and
the remainders an environment did not get are carried to the next collection, so the
long-run shares converge to the weights (each environment's cumulative count stays
within about one group of its exact share, never two).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np


class TaskDraw(msgspec.Struct, frozen=True):
    """One group's task: which environment, and the seed that fixes its task."""

    env: str
    seed: int


class EnvironmentSampler:
    """Picks the environment of every group of a collection, by weight."""

    def __init__(self, weights: dict[str, float], seed: int) -> None:
        if not weights:
            raise ValueError("EnvironmentSampler needs at least one environment weight")
        for name, weight in weights.items():
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(
                    f"environment {name!r} has sampling weight {weight}; weights must be "
                    "finite and > 0 (drop the environment instead of weighting it 0)"
                )
        total = sum(weights.values())
        self.names = list(weights)
        self.shares = np.array([weights[n] / total for n in self.names])
        self.carry = np.zeros(len(self.names))
        self.rng = np.random.default_rng(seed)

    def allocate(self, num_groups: int) -> dict[str, int]:
        """Groups per environment for one collection (floor or ceil of n·share)."""
        quota = num_groups * self.shares
        base = np.floor(quota + 1e-9)
        frac = np.clip(quota - base, 0.0, None)
        extra = int(round(num_groups - base.sum()))
        counts = base.copy()
        if extra > 0:
            # Largest carried remainder first; only environments with a fraction may
            # round up (so nobody exceeds its ceiling); random tie-break.
            candidates = np.flatnonzero(frac > 1e-9)
            priority = (self.carry + frac)[candidates]
            jitter = self.rng.random(len(candidates)) * 1e-9
            chosen = candidates[np.argsort(-(priority + jitter), kind="stable")[:extra]]
            counts[chosen] += 1
        self.carry += quota - counts
        return {name: int(c) for name, c in zip(self.names, counts, strict=True)}

    def sample(self, num_groups: int) -> list[str]:
        """The environment of each of ``num_groups`` groups, in a shuffled order."""
        counts = self.allocate(num_groups)
        order = [name for name, count in counts.items() for _ in range(count)]
        self.rng.shuffle(order)
        return order

    def sample_tasks(self, num_groups: int) -> list[TaskDraw]:
        """Environments and task seeds for one collection's groups."""
        envs = self.sample(num_groups)
        seeds = self.rng.integers(0, 2**31 - 1, size=len(envs))
        return [TaskDraw(env, int(seed)) for env, seed in zip(envs, seeds, strict=True)]

    def tasks_of(self, env: str, num_groups: int) -> list[TaskDraw]:
        """``num_groups`` fresh tasks of one environment, outside the allocation: the
        replacements for groups dynamic sampling dropped, so that each environment keeps
        the share this collection's allocation gave it."""
        if env not in self.names:
            raise ValueError(f"environment {env!r} is not one of the sampler's {self.names}")
        seeds = self.rng.integers(0, 2**31 - 1, size=num_groups)
        return [TaskDraw(env, int(seed)) for seed in seeds]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same sequence after a restart."""
        return {"names": list(self.names), "carry": self.carry.tolist(),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from ``state_dict``; the environments must be the same."""
        if state["names"] != self.names:
            raise ValueError(
                f"sampler checkpoint has environments {state['names']}, this run has "
                f"{self.names}; resume with the same [[environments]]"
            )
        self.carry = np.array(state["carry"], dtype=float)
        self.rng.bit_generator.state = state["rng"]

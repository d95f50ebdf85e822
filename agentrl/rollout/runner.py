"""The rollout runner: groups of rollouts collected concurrently, with dynamic sampling.

Each group is one task (one environment, one task seed) attempted G times concurrently;
the rollouts of a group share the seed, so they start from the same task. Groups finish
out of order and a collection keeps whichever complete first.

Dynamic sampling (``rollout.filter_uniform_groups``): a group whose valid rewards are all
equal (or that has no valid rollout) carries no signal and is dropped; the runner keeps
launching groups, in at most ``rollout.max_extra_collections`` extra rounds, until the
step has its rollouts. If the cap is reached first it warns and falls back to filling
the shortfall with the dropped groups (groups with valid rollouts first), so a step
always trains on the number of rollouts the batch plan promised when it can.
"""

from __future__ import annotations

import asyncio
import math
import random
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.config import Config, EnvironmentConfig
from agentrl.metrics import drop_reason
from agentrl.rollout.engine import InferenceEngine
from agentrl.rollout.multi_turn import RolloutSpec, play_rollout
from agentrl.types import Group, Rollout


class CollectionResult(msgspec.Struct):
    """The groups kept for one step, and what dynamic sampling dropped on the way."""

    groups: list[Group]
    dropped: dict[str, dict[str, int]] = {}
    """Dropped groups per environment name and reason ("uniform reward 1.0", "all invalid")."""
    num_rounds: int = 1
    """Collection rounds run (1 + extra rounds of dynamic sampling)."""
    fallback_groups: int = 0
    """Dropped groups put back because the extra-round cap was reached."""
    stale_dropped: dict[str, int] = {}
    """Rollouts dropped per environment because a token was older than the staleness
    bound (``agentrl.staleness``); asynchronous collection only."""
    engine_idle_s: float = 0.0
    """Seconds the engine waited for recent enough weights before this collection
    (asynchronous collection only)."""

    @property
    def rollouts(self) -> list[Rollout]:
        """Every rollout of the kept groups, group by group."""
        return [r for g in self.groups for r in g.rollouts]


def _default_make_env(env_config: EnvironmentConfig) -> Any:
    from agentrl.registry import make  # lazy: the registry imports every environment

    return make(env_config.id, **env_config.kwargs)


class RolloutRunner:
    """Collects the rollouts of one step from the configured environments."""

    def __init__(
        self, config: Config, engine: InferenceEngine, tokenizer: Any, sampler: Any,
        make_env: Callable[[EnvironmentConfig], Any] = _default_make_env,
    ) -> None:
        """``sampler``: an ``EnvironmentSampler`` over the environments' display names."""
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.make_env = make_env
        self.envs = {e.display_name(): e for e in config.environments}
        self._limit = asyncio.Semaphore(config.rollout.max_concurrent_rollouts)

    async def collect_group(self, group_id: str, env_name: str, task_seed: int) -> Group:
        """The G rollouts of one task, played concurrently."""
        env_config = self.envs[env_name]
        size = self.config.group_size(env_config)
        rollouts = await asyncio.gather(*(
            self._rollout(env_config, RolloutSpec(
                rollout_id=f"{group_id}-r{j}", group_id=group_id, env=env_name,
                task_seed=task_seed, sampling_seed=_seed_of(f"{group_id}-r{j}", task_seed),
                reward_scale=env_config.reward_scale,
            ))
            for j in range(size)
        ))
        return Group(group_id, env_name, list(rollouts), task_seed=task_seed)

    async def _rollout(self, env_config: EnvironmentConfig, spec: RolloutSpec) -> Rollout:
        async with self._limit:
            env = self.make_env(env_config)
            try:
                return await play_rollout(spec, env, self.engine, self.tokenizer,
                                          self.config.rollout, self.config.compaction)
            finally:
                close = getattr(env, "close", None)
                if close is not None:
                    close()

    async def collect(self, step: int, num_rollouts_needed: int) -> CollectionResult:
        """Collect groups until ``num_rollouts_needed`` rollouts are kept (see module doc)."""
        kept: list[Group] = []
        dropped_groups: list[Group] = []
        dropped: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        filtering = self.config.rollout.filter_uniform_groups
        max_rounds = 1 + (self.config.rollout.max_extra_collections if filtering else 0)
        next_index, rounds = 0, 0
        while _count(kept) < num_rollouts_needed and rounds < max_rounds:
            missing = num_rollouts_needed - _count(kept)
            draws = self.sampler.sample_tasks(self._groups_for(missing))
            ids = [f"s{step}-g{next_index + i}" for i in range(len(draws))]
            next_index += len(draws)
            rounds += 1
            async for group in _as_completed(
                [self.collect_group(gid, d.env, d.seed) for gid, d in zip(ids, draws,
                                                                         strict=True)],
                stop=lambda: _count(kept) >= num_rollouts_needed,
            ):
                reason = drop_reason(group) if filtering else None
                if reason is None:
                    kept.append(group)
                else:
                    dropped[group.env][reason] += 1
                    dropped_groups.append(group)
        fallback = self._fallback(kept, dropped_groups, num_rollouts_needed, rounds)
        return CollectionResult(
            groups=kept + fallback, dropped={k: dict(v) for k, v in dropped.items()},
            num_rounds=rounds, fallback_groups=len(fallback),
        )

    def _groups_for(self, num_rollouts: int) -> int:
        sizes = [self.config.group_size(e) for e in self.config.environments]
        return max(1, math.ceil(num_rollouts / (sum(sizes) / len(sizes))))

    def _fallback(self, kept: list[Group], dropped: list[Group], needed: int,
                  rounds: int) -> list[Group]:
        missing = needed - _count(kept)
        if missing <= 0:
            return []
        warnings.warn(
            f"dynamic sampling kept {_count(kept)} of {needed} rollouts with signal after "
            f"{rounds} collection round(s) (rollout.max_extra_collections = "
            f"{self.config.rollout.max_extra_collections}); filling with dropped groups, "
            "which add no gradient. Raise max_extra_collections or make tasks harder/easier.",
            stacklevel=2,
        )
        fill: list[Group] = []
        # groups with valid rollouts first: they at least count toward the token total
        for group in sorted(dropped, key=lambda g: not any(r.valid for r in g.rollouts)):
            if _count(kept) + _count(fill) >= needed:
                break
            fill.append(group)
        return fill


def _count(groups: list[Group]) -> int:
    return sum(len(g.rollouts) for g in groups)


def _seed_of(rollout_id: str, task_seed: int) -> int:
    """A sampling seed fixed by the rollout's id and task: reproducible, batch-independent."""
    return random.Random(f"{task_seed}:{rollout_id}").getrandbits(31)


async def _as_completed(coros: list[Any], stop: Callable[[], bool]):
    """Yield results as they finish; once ``stop()`` holds, cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        for next_done in asyncio.as_completed(tasks):
            yield await next_done
            if stop():
                return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

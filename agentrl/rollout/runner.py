"""The rollout runner: groups of rollouts collected concurrently, with dynamic sampling.

Each group is one task (one environment, one task seed) attempted G times concurrently;
the rollouts of a group share the seed, so they start from the same task. Groups finish
out of order and a collection keeps whichever complete first; with ``train.deterministic``
it keeps them in launch order instead, so which groups a step trains on never depends on
timing.

Dynamic sampling (``rollout.filter_uniform_groups``): a group whose valid rewards are all
equal (or that has no valid rollout) carries no signal and is dropped; the runner
replaces it with a fresh task of the same environment, in at most
``rollout.max_extra_collections`` extra rounds. The first round's allocation fixes how
many groups each environment brings (its weight's share), so a collection always holds
exactly the planned rollouts and each environment exactly its groups, whatever the group
sizes (invariants 7 and 8). If the cap is reached first it warns and fills each
environment's shortfall with its own dropped groups (those with valid rollouts first).

Every rollout runs in a fresh environment instance through
:func:`agentrl.rollout.episode.play_episode` (contained from constructor to close); its
invalid kinds are counted for every rollout played, kept or dropped
(``CollectionResult.invalid``). An environment whose step held the event loop past its
deadline (code holding the GIL) runs its later rollouts in worker processes.
"""

from __future__ import annotations

import asyncio
import functools
import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.config import Config, EnvironmentConfig
from agentrl.engines.interface import InferenceEngine
from agentrl.observe.costs import PlayedCosts
from agentrl.observe.metrics import drop_reason
from agentrl.rollout.chat_style import style_of
from agentrl.rollout.env_contract import EnvError
from agentrl.rollout.episode import EnvSource, isolation_of, play_episode
from agentrl.rollout.failures import MASKED, RETRY, FailureRules, retry_id
from agentrl.rollout.health import InvalidLog
from agentrl.rollout.multi_turn import RolloutSpec
from agentrl.rollout.seeds import derived_seed
from agentrl.types import Group, Rollout

STALL_LIMIT_S = 1.0
"""A call that kept the event loop frozen this long past its deadline moves its
environment to worker processes for the rest of the run."""


class CollectionResult(msgspec.Struct):
    """The groups kept for one step, and what dynamic sampling dropped on the way."""

    groups: list[Group]
    dropped: dict[str, dict[str, int]] = {}
    """Dropped groups per environment name and reason ("uniform reward 1.0", "all invalid")."""
    num_rounds: int = 1
    """Collection rounds run (1 + extra rounds of dynamic sampling)."""
    fallback_groups: int = 0
    """Dropped groups put back because the extra-round cap was reached."""
    num_played: dict[str, int] = {}
    """Rollouts played per environment name, kept or dropped."""
    invalid: dict[str, dict[str, int]] = {}
    """Masked (invalid) rollouts played per environment name and kind (``step_raised``,
    ...): ambiguous failures, and infrastructure ones whose retries ran out."""
    retried: dict[str, dict[str, int]] = {}
    """Attempts retried per environment name and kind (infrastructure failures,
    ``agentrl.rollout.failures``); each was replaced by a fresh attempt at its task."""
    kept: dict[str, dict[str, int]] = {}
    """Policy-caused failures trained as outcomes, per environment name and kind."""
    first_errors: dict[str, str] = {}
    """"<env>/<kind>" -> the first such failure of the collection, with its traceback."""
    engine_idle_s: float = 0.0
    """Seconds the engine waited for recent enough weights before this collection
    (asynchronous collection only)."""
    costs: dict[str, PlayedCosts] = {}
    """Per environment name, what every rollout played used and earned, dropped groups
    included (``agentrl.observe.costs``)."""
    carried_groups: int = 0
    """Groups drawn for an earlier collection and trained in this one: they were still
    running when that one was due (``rollout.carry_over``, ``agentrl.rollout.carry_over``)."""

    @property
    def rollouts(self) -> list[Rollout]:
        """Every rollout of the kept groups, group by group."""
        return [r for g in self.groups for r in g.rollouts]


def _default_make_env(env_config: EnvironmentConfig) -> Any:
    from agentrl.envs.registry import make  # lazy: the registry imports every environment

    return make(env_config.id, **env_config.kwargs)


def _in_model_format(make_env: Callable[[EnvironmentConfig], Any],
                     env_config: EnvironmentConfig, tool_format: str) -> Any:
    """Build an environment that speaks the model's tool-call format (an ``AgentEnv``
    without a parser of its own adopts it; see ``agentrl.envs.parsers``)."""
    from agentrl.envs.parsers import adopt_tool_format

    return adopt_tool_format(make_env(env_config), tool_format)


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
        self.tool_format = style_of(tokenizer).tool_format
        """The model's tool-call format (``prepare_chat`` set it on the tokenizer)."""
        self.envs = {e.display_name(): e for e in config.environments}
        self._limits: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        """rollout.max_concurrent_rollouts, one semaphore per event loop: a semaphore that
        ever made a rollout wait belongs to that loop, and a runner may collect under
        several (each ``asyncio.run`` is a new loop)."""
        self.log = InvalidLog()
        self.rules = FailureRules(config.rollout)
        self.costs: dict[str, PlayedCosts] = {}
        """What this collection's rollouts used so far, per environment."""
        self._in_process: set[str] = set()
        """Environments moved to worker processes after a call froze the event loop."""
        self.endpoint = None
        """The OpenAI-compatible endpoint of the harness environments (docs/harnesses.md),
        listening from the first harness rollout on; None without any."""
        if any(e.harness is not None for e in config.environments):
            from agentrl.rollout.harness_endpoint import HarnessEndpoint

            self.endpoint = HarnessEndpoint(engine, tokenizer, config.rollout,
                                            config.endpoint)

    async def collect_group(self, group_id: str, env_name: str, task_seed: int) -> Group:
        """The G rollouts of one task, played concurrently."""
        env_config = self.envs[env_name]
        size = self.config.group_size(env_config)
        rollouts = await asyncio.gather(*(
            self._rollout(env_config, RolloutSpec(
                rollout_id=f"{group_id}-r{j}", group_id=group_id, env=env_name,
                task_seed=task_seed, sampling_seed=derived_seed(task_seed, f"{group_id}-r{j}"),
                reward_scale=env_config.reward_scale,
            ))
            for j in range(size)
        ))
        return Group(group_id, env_name, list(rollouts), task_seed=task_seed)

    def _limit(self) -> asyncio.Semaphore:
        """The running loop's semaphore over concurrent rollouts (made on first use; the
        loops that ended are forgotten)."""
        loop = asyncio.get_running_loop()
        if loop not in self._limits:
            self._limits = {old: sem for old, sem in self._limits.items() if not old.is_closed()}
            self._limits[loop] = asyncio.Semaphore(self.config.rollout.max_concurrent_rollouts)
        return self._limits[loop]

    async def _rollout(self, env_config: EnvironmentConfig, spec: RolloutSpec) -> Rollout:
        """One rollout under the failure rules (``agentrl.rollout.failures``): an attempt
        that failed for infrastructure reasons is retried from the same task with a fresh
        environment, up to ``rollout.max_retries`` times, then masked and named."""
        first_kind = ""
        for attempt in range(self.rules.max_retries + 1):
            tried = spec if attempt == 0 else msgspec.structs.replace(
                spec, rollout_id=retry_id(spec.rollout_id, attempt),
                sampling_seed=derived_seed(spec.task_seed, retry_id(spec.rollout_id, attempt)))
            rollout = await self._attempt(env_config, tried)
            rollout.retry_of = None if attempt == 0 else spec.rollout_id
            outcome = self.rules.outcome(rollout)
            if outcome != RETRY:
                break
            first_kind = first_kind or rollout.stats.error_kind or "unknown"
            if attempt < self.rules.max_retries:
                self.log.retry(rollout)
        else:
            outcome = MASKED
            self.rules.exhausted(rollout, spec.task_seed, first_kind)
        self.log.count(rollout, outcome)
        return rollout

    async def _attempt(self, env_config: EnvironmentConfig, spec: RolloutSpec) -> Rollout:
        """One attempt in a fresh environment instance; its cost counts either way."""
        async with self._limit():
            rollout = await play_episode(spec, self._source(env_config), self.engine,
                                         self.tokenizer, self.config.rollout,
                                         self.config.compaction, self._on_failure,
                                         self.endpoint)
        failure = clip_long_rows(rollout, self.config.batch.max_tokens_per_microbatch)
        if failure is not None:
            self._on_failure(spec, failure)
        self.costs.setdefault(spec.env, PlayedCosts()).count(rollout)
        return rollout

    def _source(self, env_config: EnvironmentConfig) -> EnvSource:
        """How to build this environment: the default factory resolves the class's
        ``isolation``; a custom ``make_env`` runs in this process."""
        name = env_config.display_name()
        factory = functools.partial(_in_model_format, self.make_env, env_config,
                                    self.tool_format)
        if self.make_env is not _default_make_env:
            return EnvSource(name, factory, harness=env_config.harness)
        isolation = "process" if name in self._in_process else isolation_of(env_config.id)
        return EnvSource(name, factory, isolation, env_config.harness)

    def _on_failure(self, spec: RolloutSpec, error: EnvError) -> None:
        self.log.failure(spec, error)
        stall = getattr(error, "loop_stall_s", 0.0)
        if (stall >= STALL_LIMIT_S and self.make_env is _default_make_env
                and spec.env not in self._in_process):
            self._in_process.add(spec.env)
            warnings.warn(
                f"env {spec.env!r}: a call kept the event loop frozen {stall:.1f} s past its "
                "deadline (it holds the GIL), stalling every other rollout; its next "
                "rollouts run in worker processes. Set isolation = \"process\" on its class "
                "to start that way.", stacklevel=2)

    async def collect(self, step: int, num_rollouts_needed: int) -> CollectionResult:
        """Collect the groups of ``num_rollouts_needed`` rollouts (see module doc).

        The first round's allocation fixes each environment's groups (its share, by the
        sampler); a group dynamic sampling drops is replaced by a fresh task of the SAME
        environment, so the collection holds exactly those groups, never more."""
        self.log.reset()
        self.costs = {}
        filtering = self.config.rollout.filter_uniform_groups
        max_rounds = 1 + (self.config.rollout.max_extra_collections if filtering else 0)
        draws = self.sampler.sample_tasks(self._groups_for(num_rollouts_needed))
        quota = Counter(d.env for d in draws)
        kept: list[Group] = []
        dropped_groups: list[Group] = []
        dropped: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        next_index, rounds = 0, 0
        while draws and rounds < max_rounds:
            ids = [f"s{step}-g{next_index + i}" for i in range(len(draws))]
            next_index += len(draws)
            rounds += 1
            async for group in _as_completed(
                [self.collect_group(gid, d.env, d.seed) for gid, d in zip(ids, draws,
                                                                         strict=True)],
                in_launch_order=self.config.train.deterministic,
            ):
                reason = drop_reason(group) if filtering else None
                if reason is None:
                    kept.append(group)
                else:
                    dropped[group.env][reason] += 1
                    dropped_groups.append(group)
            missing = _missing(quota, kept)
            draws = [d for env, n in missing.items() for d in self.sampler.tasks_of(env, n)]
        fallback = self._fallback(_missing(quota, kept), dropped_groups, num_rollouts_needed,
                                  rounds, _count(kept))
        return CollectionResult(
            groups=kept + fallback, dropped={k: dict(v) for k, v in dropped.items()},
            num_rounds=rounds, fallback_groups=len(fallback), **self.take_played())

    def draw(self, step: int, num_rollouts_needed: int) -> list[tuple[str, Any]]:
        """The tasks of collection ``step`` (group ids ``s<step>-g<i>``), as
        :meth:`collect` draws them, for a collector that starts the groups itself."""
        draws = self.sampler.sample_tasks(self._groups_for(num_rollouts_needed))
        return [(f"s{step}-g{i}", d) for i, d in enumerate(draws)]

    def take_played(self) -> dict[str, Any]:
        """What every rollout played since the last call used and how it failed (the
        played, invalid, retried, kept, first-error and cost fields of a
        :class:`CollectionResult`), and start counting afresh."""
        played = {"num_played": dict(self.log.played), "invalid": self.log.invalid_counts(),
                  "retried": _plain(self.log.retried), "kept": _plain(self.log.kept),
                  "first_errors": dict(self.log.first), "costs": self.costs}
        self.log.reset()
        self.costs = {}
        return played

    def _groups_for(self, num_rollouts: int) -> int:
        """Groups whose expected rollouts are ``num_rollouts``: divided by the group size
        weighted by each environment's share (exact for the batch plan's collection)."""
        total = sum(e.weight for e in self.config.environments)
        size = sum(e.weight / total * self.config.group_size(e)
                   for e in self.config.environments)
        groups = num_rollouts / size
        return max(1, round(groups) if abs(groups - round(groups)) < 1e-6 else
                   math.ceil(groups))

    def _fallback(self, missing: dict[str, int], dropped: list[Group], needed: int,
                  rounds: int, num_kept: int) -> list[Group]:
        """Each environment's shortfall filled from its own dropped groups."""
        if not missing:
            return []
        warnings.warn(
            f"dynamic sampling kept {num_kept} of {needed} rollouts with signal after "
            f"{rounds} collection round(s) (rollout.max_extra_collections = "
            f"{self.config.rollout.max_extra_collections}); filling with dropped groups, "
            "which add no gradient. Raise max_extra_collections or make tasks harder/easier.",
            stacklevel=2,
        )
        fill: list[Group] = []
        # groups with valid rollouts first: they at least count toward the token total
        for group in sorted(dropped, key=lambda g: not any(r.valid for r in g.rollouts)):
            if missing.get(group.env, 0) > 0:
                fill.append(group)
                missing[group.env] -= 1
        return fill


def _missing(quota: Counter[str], kept: list[Group]) -> dict[str, int]:
    """Groups each environment still owes the collection (only those with a shortfall)."""
    have = Counter(g.env for g in kept)
    return {env: n - have[env] for env, n in quota.items() if n > have[env]}


def clip_long_rows(rollout: Rollout, max_tokens: int) -> EnvError | None:
    """Cut every segment longer than the micro-batch budget (no packing could hold it and
    the step would abort); a valid rollout with such a segment becomes invalid
    (``row_too_long``). An invalid rollout's tokens carry no gradient, so cutting changes
    nothing but the packing."""
    longest = max((len(s.token_ids) for s in rollout.segments), default=0)
    if longest <= max_tokens:
        return None
    for segment in rollout.segments:
        segment.token_ids = segment.token_ids[:max_tokens]
        segment.loss_mask = segment.loss_mask[:max_tokens]
        segment.logprobs = segment.logprobs[:max_tokens]
        segment.num_prompt_tokens = min(segment.num_prompt_tokens, max_tokens)
    if not rollout.valid:
        return None
    error = EnvError("row_too_long", f"env {rollout.env!r}: a row of {longest} tokens is "
                     f"longer than batch.max_tokens_per_microbatch = {max_tokens}")
    rollout.valid = False
    rollout.stats.error, rollout.stats.error_kind = str(error), error.kind
    return error


def _plain(counts: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    return {env: dict(kinds) for env, kinds in counts.items() if kinds}


def _count(groups: list[Group]) -> int:
    return sum(len(g.rollouts) for g in groups)


async def _as_completed(coros: list[Any], in_launch_order: bool = False):
    """Yield results as they finish (or, ``in_launch_order``, in the order given, all
    still running concurrently); cancel what still runs when the caller stops early."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        for next_done in tasks if in_launch_order else asyncio.as_completed(tasks):
            yield await next_done
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

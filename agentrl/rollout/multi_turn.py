"""One rollout: the multi-turn loop context → engine.generate → env.step → observation.

The context only grows by appending ids (see ``agentrl.rollout.context``). When the next
turn's context would pass ``compaction.max_context_tokens``, the compactor shrinks the
conversation and a new segment starts whose prompt is the compacted context. The reward
is the sum of step rewards times the environment's ``reward_scale``. An environment
failure (exception or timeout) ends the rollout as invalid with ``stats.error`` set.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.rollout.compaction import make_compactor
from agentrl.rollout.context import ChatContext
from agentrl.rollout.engine import InferenceEngine, SamplingParams
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.staleness import generation_versions
from agentrl.types import Rollout, RolloutStats, Segment


class RolloutSpec(msgspec.Struct, frozen=True):
    """Which rollout to play: its ids, its environment's name and the group's task seed."""

    rollout_id: str
    group_id: str
    env: str
    task_seed: int
    sampling_seed: int | None = None
    reward_scale: float = 1.0


class EnvError(Exception):
    """The environment raised or timed out, or the engine refused a request; the rollout
    becomes invalid."""


class RolloutPlayer:
    """Plays one rollout; its state stays readable if a timeout cancels it midway."""

    def __init__(
        self, spec: RolloutSpec, env: Any, engine: InferenceEngine, tokenizer: Any,
        rollout: RolloutConfig, compaction: CompactionConfig,
    ) -> None:
        self.spec = spec
        self.env = env
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = rollout
        self.compaction = compaction
        self.stop_ids: tuple[int, ...] = (tokenizer.eos_token_id,)
        self.segments: list[Segment] = []
        self.current: SegmentBuilder | None = None
        self.stats = RolloutStats()
        self.tool_errors: Counter[str] = Counter()
        self.reward_components: dict[str, float] = {}
        self.reward = 0.0

    async def play(self) -> Rollout:
        """Run the loop to the end; environment failures give an invalid rollout."""
        try:
            await self._loop()
        except EnvError as exc:
            self.stats.error = str(exc)
        return self.result()

    def result(self, error: str | None = None) -> Rollout:
        """The rollout as it stands (also after a cancellation by the rollout timeout)."""
        if error is not None:
            self.stats.error = error
        segments = list(self.segments)
        if self.current is not None:
            segments.append(self.current.build())
        self.stats.tool_errors = dict(self.tool_errors)
        self.stats.num_generated_tokens = sum(s.num_generated_tokens for s in segments)
        spec = self.spec
        return Rollout(
            rollout_id=spec.rollout_id, group_id=spec.group_id, env=spec.env,
            segments=segments, reward=self.reward * spec.reward_scale,
            valid=self.stats.error is None, stats=self.stats,
            reward_components=dict(self.reward_components),
        )

    async def _env_call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.wait_for(fn(*args), self.config.step_timeout_s)
        except TimeoutError:
            raise EnvError(f"env.{what} timed out after {self.config.step_timeout_s}s") from None
        except Exception as exc:  # any environment crash invalidates only this rollout
            raise EnvError(f"env.{what} raised {type(exc).__name__}: {exc}") from exc

    async def _generate(self, params: SamplingParams) -> Any:
        """One engine call; a request the engine refuses (e.g. a context past its
        max_len) invalidates this rollout only, never the whole collection."""
        assert self.current is not None
        try:
            return await self.engine.generate(list(self.current.token_ids), params)
        except ValueError as exc:
            raise EnvError(f"engine refused the request: {exc}") from exc

    def _params(self, max_tokens: int) -> SamplingParams:
        seed = self.spec.sampling_seed
        return SamplingParams(
            temperature=self.config.temperature, top_p=self.config.top_p,
            max_tokens=max_tokens, stop_token_ids=self.stop_ids,
            seed=None if seed is None else seed + self.stats.num_turns * 1_000_003,
        )

    async def _loop(self) -> None:
        messages, _ = await self._env_call("reset", _reset, self.env, self.spec.task_seed)
        context = ChatContext(self.tokenizer, self.env.tool_schemas(), messages)
        compactor = make_compactor(self.compaction, context.head, self.engine, self.stop_ids)
        self.current = SegmentBuilder(context.prompt_ids())
        for _ in range(self.config.max_turns):
            budget = min(self.config.max_new_tokens,
                         self.config.max_rollout_tokens - self._generated_so_far())
            if budget < 1:
                self.stats.truncated = True
                return
            params = self._params(budget)
            generation = await self._generate(params)
            self.current.add_generated(generation.token_ids, generation.logprobs,
                                       generation_versions(generation, self.engine))
            self.stats.num_turns += 1
            text = context.assistant_text(generation.token_ids, self.stop_ids)
            observation, reward, terminated, truncated, info = await self._env_call(
                "step", _step, self.env, text)
            self._record(reward, info)
            if terminated or truncated:
                self.stats.truncated = bool(truncated and not terminated)
                return
            turn, delta_ids = context.turn_delta(generation.token_ids, self.stop_ids,
                                                 observation)
            if compactor is None or (
                len(self.current) + len(delta_ids) <= self.compaction.max_context_tokens
            ):
                context.turns.append(turn)
                self.current.add_observation(delta_ids)
                continue
            if not await self._compact(compactor, context, turn, generation.token_ids, params):
                return
        self.stats.truncated = True  # out of turns without the environment ending it

    async def _compact(self, compactor: Any, context: ChatContext, turn: Any,
                       generated_ids: list[int], params: SamplingParams) -> bool:
        """Start a new segment from a compacted context; False ends the rollout (truncated)."""
        if self.stats.num_compactions >= self.compaction.max_compactions:
            self.stats.truncated = True
            return False
        assert self.current is not None
        try:
            prompt_ids = await compactor.compact(context, turn, generated_ids, self.current,
                                                 params)
        except ValueError as exc:  # the summary request did not fit the engine
            raise EnvError(f"engine refused the summary request: {exc}") from exc
        self.segments.append(self.current.build())
        self.current = None
        if prompt_ids is None:  # not even the task fits the budget
            self.stats.truncated = True
            return False
        self.stats.num_compactions += 1
        self.current = SegmentBuilder(prompt_ids)
        return True

    def _generated_so_far(self) -> int:
        done = sum(s.num_generated_tokens for s in self.segments)
        return done + (sum(self.current.loss_mask) if self.current is not None else 0)

    def _record(self, reward: float, info: dict[str, Any]) -> None:
        self.reward += float(reward)
        self.tool_errors.update(info.get("tool_errors") or {})
        self.reward_components.update(info.get("reward_components") or {})


async def _reset(env: Any, seed: int) -> tuple[list[Any], dict]:
    # reset is cheap and synchronous by the environment contract
    return env.reset(seed=seed)


async def _step(env: Any, text: str) -> tuple[list[Any], float, bool, bool, dict]:
    if hasattr(env, "astep"):
        return await env.astep(text)
    return await asyncio.to_thread(env.step, text)


async def play_rollout(
    spec: RolloutSpec, env: Any, engine: InferenceEngine, tokenizer: Any,
    rollout: RolloutConfig, compaction: CompactionConfig,
) -> Rollout:
    """Play one rollout under the per-rollout timeout; a timeout gives an invalid rollout."""
    player = RolloutPlayer(spec, env, engine, tokenizer, rollout, compaction)
    try:
        return await asyncio.wait_for(player.play(), rollout.rollout_timeout_s)
    except TimeoutError:
        return player.result(error=f"rollout timed out after {rollout.rollout_timeout_s}s")

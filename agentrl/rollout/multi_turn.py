"""One rollout: the multi-turn loop context → engine.generate → env.step → observation.

The context only grows by appending ids (see ``agentrl.rollout.context``). When the next
turn's context would pass ``compaction.max_context_tokens``, the compactor shrinks the
conversation and a new segment starts whose prompt is the compacted context. The reward
is the sum of step rewards times the environment's ``reward_scale``. An environment
failure (exception, timeout, a result that breaks the contract, a non-finite reward) ends
the rollout as invalid with ``stats.error`` and ``stats.error_kind`` set; the environment
is called only through :class:`agentrl.rollout.env_guard.GuardedEnv`.

Turn limits: the rollout ends at whichever limit comes first, the environment's own
``max_turns`` (it returns ``truncated=True``: reason ``"env"``) or ``rollout.max_turns``
(the runner stops asking: reason ``"max_turns"``). Every truncation is named in
``stats.truncation_reason`` (see :data:`agentrl.types.TRUNCATION_REASONS`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.engines.interface import InferenceEngine, SamplingParams
from agentrl.rollout.chat_style import stop_ids_of
from agentrl.rollout.compact_tool import (
    COMPACT_TOOL,
    CompactRequest,
    check_tool_names,
    find_compact_call,
    offered_tools,
)
from agentrl.rollout.compaction import Compacted, make_compactor, restart_from_summary
from agentrl.rollout.context import ChatContext, TemplateRenderError, TemplateRewrite
from agentrl.rollout.env_contract import EnvError, scaled_reward
from agentrl.rollout.env_guard import GuardedEnv
from agentrl.rollout.facts import FactTracker
from agentrl.rollout.metering import MeteredEngine
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.rollout.subagents import RolloutTree
from agentrl.staleness import generation_versions
from agentrl.types import Compaction, Rollout, RolloutStats, Segment, Spend


class RolloutSpec(msgspec.Struct, frozen=True):
    """Which rollout to play: its ids, its environment's name and the group's task seed."""

    rollout_id: str
    group_id: str
    env: str
    task_seed: int
    sampling_seed: int | None = None
    reward_scale: float = 1.0


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
        self.stop_ids: tuple[int, ...] = stop_ids_of(tokenizer)
        self.segments: list[Segment] = []
        self.current: SegmentBuilder | None = None
        self.stats = RolloutStats()
        self.tool_errors: Counter[str] = Counter()
        self.reward_components: dict[str, float] = {}
        self.reward = 0.0
        self.failure: EnvError | None = None
        """What made the rollout invalid (with its traceback), when something did."""
        self.facts = FactTracker([], [])
        self.head: list[dict[str, Any]] = []
        """The context's opening messages (system + task), before any compaction."""

    async def play(self) -> Rollout:
        """Run the loop to the end; environment failures give an invalid rollout."""
        try:
            await self._loop()
        except EnvError as exc:
            self.fail(exc)
        except TemplateRenderError as exc:
            self.fail(EnvError("chat_template_raised", str(exc)))
        return self.result()

    def fail(self, failure: EnvError) -> None:
        """Mark the rollout invalid for this reason (the first reason wins)."""
        if self.failure is None:
            self.failure = failure
            self.stats.error = str(failure)
            self.stats.error_kind = failure.kind

    def result(self, error: EnvError | None = None) -> Rollout:
        """The rollout as it stands (also after a cancellation by the rollout timeout)."""
        if error is not None:
            self.fail(error)
        if self.current is not None and self.segments and not any(self.current.loss_mask):
            self._drop_unused_compaction()
        segments = list(self.segments)
        if self.current is not None:
            segments.append(self.current.build())
        self.stats.tool_errors = dict(self.tool_errors)
        self.stats.num_generated_tokens = sum(s.num_generated_tokens for s in segments)
        spec = self.spec
        reward, bad = scaled_reward(spec.env, self.reward, spec.reward_scale)
        if bad is not None:
            self.fail(bad)
        return Rollout(
            rollout_id=spec.rollout_id, group_id=spec.group_id, env=spec.env,
            segments=segments, reward=reward,
            valid=self.stats.error is None, stats=self.stats,
            reward_components=dict(self.reward_components),
        )

    async def _generate(self, params: SamplingParams) -> Any:
        """One engine call; a request the engine refuses (e.g. a context past its
        max_len), or a replica that cannot be reached, invalidates this rollout only,
        never the whole collection."""
        assert self.current is not None
        try:
            return await self.engine.generate(list(self.current.token_ids), params,
                                              key=self.spec.rollout_id)
        except ValueError as exc:
            raise EnvError("engine_refused", f"engine refused the request: {exc}") from exc
        except ConnectionError as exc:  # the replica's URL is in the message
            raise EnvError("engine_unavailable", f"engine replica unavailable: {exc}") from exc

    def _params(self, max_tokens: int) -> SamplingParams:
        seed = self.spec.sampling_seed
        return SamplingParams(
            temperature=self.config.temperature, top_p=self.config.top_p,
            max_tokens=max_tokens, stop_token_ids=self.stop_ids,
            seed=None if seed is None else seed + self.stats.num_turns * 1_000_003,
        )

    async def _loop(self) -> None:
        messages = await self.env.reset(self.spec.task_seed)
        tools = await self.env.tool_schemas()
        self.facts = FactTracker(await self.env.needed_facts(), messages)
        self.stats.needed_facts = list(self.facts.needed)
        if self.compaction.strategy == "tool":
            check_tool_names(self.spec.env, tools)
        context = ChatContext(self.tokenizer, offered_tools(self.compaction.strategy, tools),
                              messages)
        self.head = list(context.head)
        compactor = make_compactor(self.compaction, context.head, self.engine, self.stop_ids,
                                   key=self.spec.rollout_id)
        self.current = SegmentBuilder(context.prompt_ids())
        for _ in range(self.config.max_turns):
            budget = min(self.config.max_new_tokens,
                         self.config.max_rollout_tokens - self._generated_so_far())
            if budget < 1:
                self._truncate("max_rollout_tokens")
                return
            params = self._params(budget)
            generation = await self._generate(params)
            self.current.add_generated(generation.token_ids, generation.logprobs,
                                       generation_versions(generation, self.engine))
            self.stats.num_turns += 1
            text = context.assistant_text(generation.token_ids, self.stop_ids)
            if not await self._turn(context, compactor, generation.token_ids, text, params):
                return
        self._truncate("max_turns")  # out of turns without the environment ending it

    async def _turn(self, context: ChatContext, compactor: Any, generated_ids: list[int],
                    text: str, params: SamplingParams) -> bool:
        """Act on one reply: a ``compact`` call, else an environment step; False when
        the rollout ended."""
        request = (find_compact_call(text) if self.compaction.strategy == "tool" else None)
        if request is not None:
            return await self._compact_by_tool(context, compactor, request, generated_ids,
                                               params)
        observation, reward, terminated, truncated, info = await self.env.step(text)
        self._record(reward, info)
        if terminated or truncated:
            if truncated and not terminated:
                self._truncate("env")
            return False
        limit = self.config.max_tool_errors
        if limit is not None and sum(self.tool_errors.values()) > limit:
            self._truncate("tool_errors")  # a policy-caused failure: trained (failures.py)
            return False
        self.facts.see(observation)
        return await self._observe(context, compactor, generated_ids, observation, params)

    async def _observe(self, context: ChatContext, compactor: Any, generated_ids: list[int],
                       observation: list[Any], params: SamplingParams) -> bool:
        """Append the turn and its observation, compacting first when the next context
        would pass the budget; False when the rollout ended."""
        assert self.current is not None
        try:
            turn, delta_ids = context.turn_delta(generated_ids, self.stop_ids, observation)
        except TemplateRewrite as rewrite:
            return await self._rerendered(context, compactor, rewrite, generated_ids, params)
        if compactor is None or (
            len(self.current) + len(delta_ids) <= self.compaction.max_context_tokens
        ):
            context.turns.append(turn)
            self.current.add_observation(delta_ids)
            return True
        if not self._turn_follows():  # nothing would read a compacted context (or summary)
            return True
        return await self._compact(compactor, context, turn, generated_ids, params)

    async def _rerendered(self, context: ChatContext, compactor: Any,
                          rewrite: TemplateRewrite, generated_ids: list[int],
                          params: SamplingParams) -> bool:
        """The template renders the history otherwise than the engine saw it: the next
        row starts from the template's own rendering of the whole conversation (a
        compaction with cause "template", not counted against max_compactions), or from
        a compacted one when that would pass the budget. Each row keeps exactly the
        tokens the engine saw."""
        context.turns.append(rewrite.turn)
        prompt_ids = context.prompt_ids()
        if compactor is not None and len(prompt_ids) > self.compaction.max_context_tokens:
            context.turns.pop()
            return await self._compact(compactor, context, rewrite.turn, generated_ids, params)
        return self._start_segment(Compacted(prompt_ids), "template", rewrite.reason)

    def _num_compactions(self) -> int:
        """Compactions that count against ``compaction.max_compactions`` (a template's
        re-rendering is no compaction the budget or the policy asked for)."""
        return sum(c.cause != "template" for c in self.stats.compactions)

    async def _compact_by_tool(self, context: ChatContext, compactor: Any,
                               request: CompactRequest, generated_ids: list[int],
                               params: SamplingParams) -> bool:
        """The policy's ``compact`` call: restart from its summary (a new segment), or
        answer an unusable call with a tool error (under the same budget as any
        observation); False ends the rollout."""
        assert self.current is not None
        if request.num_other_calls:
            self.tool_errors["compact_not_alone"] += request.num_other_calls
        if request.error is not None:
            self.tool_errors["invalid_arguments"] += 1
            error = [{"role": "tool", "name": COMPACT_TOOL, "content": request.error}]
            return await self._observe(context, compactor, generated_ids, error, params)
        if self._num_compactions() >= self.compaction.max_compactions:
            self._truncate("max_compactions")
            return False
        assert request.summary is not None
        prompt_ids = restart_from_summary(context, self.head, list(context.turns),
                                          request.summary, self.compaction, keep_newest=False)
        if prompt_ids is None:
            return self._start_segment(None, "tool", "tool")
        compactor.policy_compacted(list(context.head))  # the head + the policy's summary
        return self._start_segment(Compacted(prompt_ids, request.summary, len(generated_ids)),
                                   "tool", "tool")

    async def _compact(self, compactor: Any, context: ChatContext, turn: Any,
                       generated_ids: list[int], params: SamplingParams) -> bool:
        """Start a new segment from a compacted context; False ends the rollout (truncated)."""
        if self._num_compactions() >= self.compaction.max_compactions:
            self._truncate("max_compactions")
            return False
        assert self.current is not None
        try:
            compacted = await compactor.compact(context, turn, generated_ids, self.current,
                                                params)
        except ValueError as exc:  # the summary request did not fit the engine
            raise EnvError("engine_refused", f"engine refused the summary request: {exc}") \
                from exc
        except ConnectionError as exc:  # the replica went away during the summary
            raise EnvError("engine_unavailable",
                           f"engine replica unavailable: {exc}") from exc
        return self._start_segment(compacted, "budget", compactor.name)

    def _start_segment(self, compacted: Compacted | None, cause: str, strategy: str) -> bool:
        """Close the current segment; continue from ``compacted`` (recorded), or end the
        rollout truncated (``context_budget``) when there is none."""
        assert self.current is not None
        self.segments.append(self.current.build())
        self.current = None
        if compacted is None:  # the task and what must be kept do not fit the budget
            self._truncate("context_budget")
            return False
        # the summary the next segment starts from: the last generated tokens of this one
        self.segments[-1].num_summary_tokens = compacted.summary_tokens
        self.stats.num_compactions += 1
        self.stats.compactions.append(self.facts.record(
            Compaction(cause=cause, strategy=strategy, segment=len(self.segments) - 1,
                       summary=compacted.summary, summary_tokens=compacted.summary_tokens),
            self.tokenizer.decode(compacted.prompt_ids)))
        self.current = SegmentBuilder(compacted.prompt_ids)
        return True

    def _turn_follows(self) -> bool:
        """Whether the loop asks the model again: turns and generated tokens are left."""
        return (self.stats.num_turns < self.config.max_turns
                and self._generated_so_far() < self.config.max_rollout_tokens)

    def _drop_unused_compaction(self) -> None:
        """The rollout ended right after a compaction (a ``compact`` call on the last turn,
        a timeout): its row would be all prompt, trained on nothing but still run forward
        and backward; drop the row, and the compaction no turn used."""
        self.current = None
        last = self.stats.compactions[-1] if self.stats.compactions else None
        if last is not None and last.segment == len(self.segments) - 1:
            self.stats.compactions.pop()
            self.stats.num_compactions -= 1

    def _truncate(self, reason: str) -> None:
        """End the rollout as truncated, with its reason (see ``TRUNCATION_REASONS``)."""
        self.stats.truncated = True
        self.stats.truncation_reason = reason

    def _generated_so_far(self) -> int:
        done = sum(s.num_generated_tokens for s in self.segments)
        return done + (sum(self.current.loss_mask) if self.current is not None else 0)

    def _record(self, reward: float, info: dict[str, Any]) -> None:
        self.reward += float(reward)
        self.tool_errors.update(info.get("tool_errors") or {})
        self.reward_components.update(info.get("reward_components") or {})


async def play_rollout(
    spec: RolloutSpec, env: Any, engine: InferenceEngine, tokenizer: Any,
    rollout: RolloutConfig, compaction: CompactionConfig,
    on_failure: Callable[[RolloutSpec, EnvError], None] | None = None,
) -> Rollout:
    """Play one rollout under the per-rollout timeout; a timeout gives an invalid rollout.

    ``env``: a :class:`GuardedEnv`, or a bare instance (guarded here, in this process).
    ``on_failure`` hears why the rollout became invalid, with the traceback.
    """
    if not isinstance(env, GuardedEnv):
        env = GuardedEnv.wrap(spec.env, env, rollout.step_timeout_s,
                              rollout.max_observation_chars)
    spend = Spend()  # every thread's requests, summaries included, through one meter
    engine = MeteredEngine(engine, spend)
    # the main thread plays a view of the environment that runs any subagent threads
    tree = RolloutTree(spec, env, engine, tokenizer, rollout, compaction, RolloutPlayer)
    player = RolloutPlayer(spec, tree.main_view(), engine, tokenizer, rollout, compaction)
    try:
        result = await asyncio.wait_for(player.play(), rollout.rollout_timeout_s)
    except TimeoutError:
        result = player.result(error=EnvError(
            "rollout_timeout", f"rollout timed out after {rollout.rollout_timeout_s}s"))
    if player.failure is not None and on_failure is not None:
        on_failure(spec, player.failure)
    result.stats.spend = spend
    env.record_time(spend)  # so far; play_episode adds construction and close
    return tree.attach(result)

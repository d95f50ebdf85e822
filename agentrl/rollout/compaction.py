"""Context compaction: when the next turn's context would pass its token budget, the
rollout continues from a shorter context, and a new segment (row) starts there.

The strategies for a budget overflow, chosen once from ``CompactionConfig.strategy``
(the policy's own ``compact`` tool, strategy ``"tool"``, is
:mod:`agentrl.rollout.compact_tool`; its budget overflows use ``compaction.fallback``):

- ``truncate``: no compaction; the rollout ends truncated (``"context_budget"``).

- ``drop_oldest``: keep the head (system + task messages) and the last
  ``keep_last_turns`` turns, with a marker message saying how many turns were dropped
  (fewer turns if the result still does not fit).
- ``summarize``: the policy is asked, at the end of the current segment (after the reply
  that overflowed, before its tool result), to summarize its progress; the summary
  request is observation (loss_mask 0), the summary itself is generated (loss_mask 1) and
  so trained in the row where it was produced. The next segment starts from the head,
  the summary and the last ``keep_last_turns`` turns (the newest with its tool result).

Either way the new segment's prompt is the compacted conversation rendered by the chat
template and encoded: exactly the ids the engine receives next. Where the chat template
cannot append the summary request to the overflowing row (it re-renders that turn), the
summary cannot be asked in that row and the rollout ends truncated (``context_budget``).

The newest turn (the reply that overflowed and the tool result it got) is never dropped,
whatever ``keep_last_turns`` says: it is what the policy must act on next (a lookup's
answer arrives there). When the head and that turn alone do not fit the budget, the
compactor returns None and the rollout ends truncated with reason ``"context_budget"``.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from agentrl.config import CompactionConfig
from agentrl.engines.interface import InferenceEngine, SamplingParams
from agentrl.rollout.context import ChatContext, TemplateRewrite, Turn
from agentrl.rollout.segment_builder import SegmentBuilder
from agentrl.staleness import generation_versions

SUMMARY_REQUEST = (
    "Your context is full. Summarize everything you need to continue this task: what the "
    "task is, what you tried, what you learned and what to do next. Reply with the summary "
    "only."
)


SUMMARY_PREFIX = "Summary of your earlier progress:\n"
"""Opens the message that carries a summary into the next segment."""


class Compacted(msgspec.Struct):
    """A compacted context: the next segment's prompt, and the summary it holds."""

    prompt_ids: list[int]
    summary: str | None = None
    summary_tokens: int = 0
    """Generated tokens of the summary."""


class Compactor(Protocol):
    """Shrinks a conversation after a budget overflow; None when it cannot fit."""

    name: str
    """The strategy, as recorded on each ``Compaction``."""

    async def compact(
        self, context: ChatContext, turn: Turn, generated_ids: list[int], segment: SegmentBuilder,
        params: SamplingParams,
    ) -> Compacted | None:
        """``turn`` (whose reply was ``generated_ids``) is the turn that overflowed."""
        ...

    def policy_compacted(self, head: list[dict[str, Any]]) -> None:
        """The policy compacted into ``head`` (the task and its summary; strategy "tool"):
        what a later budget overflow starts from, if this strategy keeps a head."""
        ...


def marker_message(num_dropped: int) -> dict[str, Any]:
    """The note left where turns were dropped, so the policy knows history is missing."""
    return {
        "role": "user",
        "content": f"[{num_dropped} earlier turn(s) were removed to fit the context window.]",
    }


def kept_turns(turns: list[Turn], keep_last_turns: int) -> list[Turn]:
    """The last ``keep_last_turns`` turns, and never fewer than the newest one."""
    return turns[-max(keep_last_turns, 1):]


def fit_turns(
    context: ChatContext, head: list[dict[str, Any]], turns: list[Turn], budget: int
) -> list[int] | None:
    """Keep as many of ``turns`` (newest last) as fit in ``budget``, always the newest;
    None when the head and the newest turn alone do not fit."""
    for start in range(len(turns)):
        context.head, context.turns = head, turns[start:]
        prompt_ids = context.prompt_ids()
        if len(prompt_ids) <= budget:
            return prompt_ids
    return None


def restart_from_summary(context: ChatContext, original_head: list[dict[str, Any]],
                         turns: list[Turn], summary: str, config: CompactionConfig,
                         keep_newest: bool = True) -> list[int] | None:
    """The prompt ids of a context restarted from the head, the summary and as many of
    the last ``keep_last_turns`` turns as fit; with ``keep_newest`` never fewer than the
    newest turn (the one that overflowed), else down to none (a ``compact`` call). None
    when even that does not fit the budget."""
    head = [*original_head, {"role": "user", "content": f"{SUMMARY_PREFIX}{summary}"}]
    if keep_newest:
        return fit_turns(context, head, kept_turns(turns, config.keep_last_turns),
                         config.max_context_tokens)
    kept = turns[len(turns) - config.keep_last_turns:] if config.keep_last_turns else []
    for start in range(len(kept) + 1):
        context.head, context.turns = head, kept[start:]
        prompt_ids = context.prompt_ids()
        if len(prompt_ids) <= config.max_context_tokens:
            return prompt_ids
    return None


class Truncate:
    """No compaction: a budget overflow ends the rollout (reason ``context_budget``)."""

    name = "truncate"

    async def compact(self, context: ChatContext, turn: Turn, generated_ids: list[int],
                      segment: SegmentBuilder, params: SamplingParams) -> Compacted | None:
        """Always None: the context is never shrunk."""
        return None

    def policy_compacted(self, head: list[dict[str, Any]]) -> None:
        """Nothing kept: the next overflow ends the rollout."""


class DropOldest:
    """Keep system + task + the last k turns, with a marker for what was dropped."""

    name = "drop_oldest"

    def __init__(self, config: CompactionConfig, original_head: list[dict[str, Any]]) -> None:
        self.config = config
        self.original_head = list(original_head)
        self.num_dropped = 0

    async def compact(
        self, context: ChatContext, turn: Turn, generated_ids: list[int], segment: SegmentBuilder,
        params: SamplingParams,
    ) -> Compacted | None:
        """Drop old turns; the marker counts every turn dropped so far in this rollout."""
        turns = [*context.turns, turn]
        kept = kept_turns(turns, self.config.keep_last_turns)
        for start in range(len(kept)):  # never past the newest turn
            dropped = self.num_dropped + len(turns) - len(kept) + start
            head = [*self.original_head, marker_message(dropped)]
            context.head, context.turns = head, kept[start:]
            prompt_ids = context.prompt_ids()
            if len(prompt_ids) <= self.config.max_context_tokens:
                self.num_dropped = dropped
                return Compacted(prompt_ids)
        return None

    def policy_compacted(self, head: list[dict[str, Any]]) -> None:
        """Later drops keep the policy's summary (the turns before it are gone already)."""
        self.original_head, self.num_dropped = list(head), 0


class Summarize:
    """The policy summarizes its history; the summary tokens are trained in the old row."""

    name = "summarize"

    def __init__(
        self, config: CompactionConfig, original_head: list[dict[str, Any]],
        engine: InferenceEngine, stop_ids: tuple[int, ...], key: str | None = None,
    ) -> None:
        self.key = key
        """The rollout's key: its summary request goes to the replica holding its prefix."""
        self.config = config
        self.original_head = list(original_head)
        self.engine = engine
        self.stop_ids = stop_ids

    async def compact(
        self, context: ChatContext, turn: Turn, generated_ids: list[int], segment: SegmentBuilder,
        params: SamplingParams,
    ) -> Compacted | None:
        """Ask for a summary at the end of this segment, then restart from it."""
        # asked before the overflowing turn's observation (the turn is kept after the
        # compaction anyway): the request then fits the engine whatever that observation
        request = {"role": "user", "content": SUMMARY_REQUEST}
        try:
            _, ask_ids = context.turn_delta(generated_ids, self.stop_ids, [request])
        except TemplateRewrite:  # the ask cannot extend the row the engine saw
            return None
        segment.add_observation(ask_ids)
        summary_params = SamplingParams(
            temperature=params.temperature, top_p=params.top_p,
            max_tokens=self.config.summary_max_tokens, stop_token_ids=self.stop_ids,
            seed=None if params.seed is None else params.seed + 7919,
        )
        summary = await self.engine.generate(list(segment.token_ids), summary_params,
                                             key=self.key)
        segment.add_generated(summary.token_ids, summary.logprobs,
                              generation_versions(summary, self.engine))
        text = context.assistant_text(summary.token_ids, self.stop_ids)
        prompt_ids = restart_from_summary(context, self.original_head, [*context.turns, turn],
                                          text, self.config)
        if prompt_ids is None:
            return None
        return Compacted(prompt_ids, text, len(summary.token_ids))

    def policy_compacted(self, head: list[dict[str, Any]]) -> None:
        """Nothing to keep: a summary asked for later replaces the policy's own."""


def make_compactor(
    config: CompactionConfig, original_head: list[dict[str, Any]], engine: InferenceEngine,
    stop_ids: tuple[int, ...], key: str | None = None,
) -> Compactor | None:
    """What a budget overflow does under the configured strategy (the tool strategy's
    ``fallback``), picked once per rollout; None for "none" (no budget)."""
    strategy = config.fallback if config.strategy == "tool" else config.strategy
    if strategy == "none":
        return None
    if strategy == "truncate":
        return Truncate()
    if strategy == "drop_oldest":
        return DropOldest(config, original_head)
    if strategy == "summarize":
        return Summarize(config, original_head, engine, stop_ids, key)
    raise ValueError(
        f'compaction.strategy = "{config.strategy}"; choose "none", "truncate", '
        '"drop_oldest", "summarize" or "tool"'
    )

"""The data that flows between stages: messages, segments, rollouts, rows, groups.

Vocabulary (one meaning each, as in docs/architecture.md):

- *rollout*: one attempt of the policy at one task; it has exactly one reward.
- *segment*: a stretch of a rollout that the engine saw as one growing context. A
  rollout whose context was compacted has several segments.
- *row*: a segment as training data, carrying a copy of its rollout's reward.
- *group*: the rollouts of one task whose rewards are compared (the GRPO baseline).
- *thread*: one conversation inside a rollout: the main one, and each subagent (or
  harness session branch) it starts. A thread is cut into segments by compaction; the
  rows of every thread of a rollout share its one reward and its one advantage.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Message(msgspec.Struct, omit_defaults=True):
    """One chat message: what environments emit and chat templates render."""

    role: str
    """"system", "user", "assistant" or "tool"."""
    content: str = ""
    name: str | None = None
    """The tool's name, on a "tool" message."""


def as_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages (``Message`` structs or dicts) as the plain dicts chat templates expect."""
    out = []
    for message in messages:
        if isinstance(message, msgspec.Struct):
            message = {k: v for k, v in msgspec.structs.asdict(message).items() if v is not None}
        out.append(dict(message))
    return out


MAIN_THREAD = "main"
"""The thread id of a rollout's own conversation."""


class Segment(msgspec.Struct):
    """Tokens of one context as the engine saw it, in order.

    ``token_ids[:num_prompt_tokens]`` is exactly the prompt the engine received when
    the segment started (for a compacted segment: the compacted context). After it
    come generated tokens (``loss_mask`` 1) interleaved with tokens the environment
    appended between turns (``loss_mask`` 0).
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    """Behaviour log-probs from the inference engine; 0.0 where loss_mask is 0."""
    num_prompt_tokens: int
    version_runs: list[tuple[int, int]] = []
    """Which policy version generated each token, run-length encoded: ``(start, version)``
    pairs, sorted by start; the generated tokens from ``start`` up to the next pair's
    start came from weights ``version`` (a version counts completed training steps).
    Empty when not recorded (batches saved before versions existed). See
    ``agentrl.staleness``."""
    thread: str = MAIN_THREAD
    """The conversation this segment belongs to: ``MAIN_THREAD``, or the id of a thread
    listed in ``Rollout.threads``."""
    boundary: str = ""
    """Why an agent program's request started this row of its thread (docs/harnesses.md):
    ``"harness_compaction:<reason>"`` (its prompt did not extend the previous one) or
    ``"drift:edited_assistant"``; "" otherwise (a thread's first row, or the runner's own
    compaction)."""
    num_summary_tokens: int = 0
    """The segment ended in a compaction summary the next segment starts from: its last
    this many generated tokens are that summary (the policy's whole ``compact`` reply, or
    a ``summarize`` summary); 0 when it did not. ``loss.summary_tokens = "mask"`` leaves
    them untrained (``agentrl.reassembler.to_rows``)."""

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the policy produced in this segment."""
        return sum(self.loss_mask)


TRUNCATION_REASONS = ("context_budget", "max_turns", "max_rollout_tokens", "max_compactions",
                      "tool_errors", "env")
"""Why a rollout ended before the environment finished it:

- ``context_budget``: what compaction must keep (system + task + the newest turn with its
  tool result) does not fit ``compaction.max_context_tokens``;
- ``max_turns``: ``rollout.max_turns`` model turns were played;
- ``max_rollout_tokens``: the rollout generated ``rollout.max_rollout_tokens`` tokens;
- ``max_compactions``: a compaction past ``compaction.max_compactions`` was needed;
- ``tool_errors``: the policy's failed tool calls (malformed, unknown tool, bad
  arguments, ...) passed ``rollout.max_tool_errors``;
- ``env``: the environment returned ``truncated=True`` (e.g. its own ``max_turns``).

``context_budget``, ``max_rollout_tokens``, ``max_compactions`` and ``tool_errors`` are
policy-caused failures (``agentrl.rollout.failures``): trained with the environment's
reward or ``rollout.failure_rewards[reason]``, never masked.
"""


COMPACTION_CAUSES = ("tool", "budget", "harness", "template")
"""Why a compaction happened: the policy called the ``compact`` tool, the next turn's
context would have passed ``compaction.max_context_tokens``, an agent program's request
did not extend its previous one (docs/harnesses.md), or the chat template re-rendered
earlier turns instead of appending (docs/models.md)."""


TEMPLATE_REWRITES = ("trimmed", "reasoning_dropped", "rewritten")
"""How a chat template's rendering of the conversation differed from the tokens the
engine saw, starting a new row (cause ``template``): it trimmed the reply's whitespace,
dropped its ``<think>`` reasoning, or rewrote earlier turns otherwise."""


HARNESS_COMPACTION_REASONS = ("rewritten", "dropped_messages", "retry", "tools_changed")
"""Why an agent program's request started a new row of its thread: it replaced turns,
left earlier turns out, sent the same messages again, or changed its tools."""


class Compaction(msgspec.Struct, omit_defaults=True):
    """One compaction of a rollout: what caused it, what it kept."""

    cause: str
    """One of ``COMPACTION_CAUSES``."""
    strategy: str
    """What compacted: "tool" (the policy's own summary), "summarize" or "drop_oldest";
    for the cause "harness", the reason: ``HARNESS_COMPACTION_REASONS``; for the cause
    "template", how the template re-rendered: ``TEMPLATE_REWRITES``."""
    segment: int
    """Index of the segment (row) it ended; the next one starts from the compacted context."""
    summary: str | None = None
    """The summary the next segment starts from (None for drop_oldest)."""
    summary_tokens: int = 0
    """Generated tokens of the summary (the whole ``compact`` call for the tool)."""
    facts_revealed: list[str] = []
    """The environment's needed facts (``AgentEnv.needed_facts``) that had appeared in the
    conversation before this compaction."""
    facts_kept: list[str] = []
    """Those of ``facts_revealed`` the compacted context still holds (in the summary, or
    in the turns kept after it)."""


SUBAGENT_FAILURES = ("depth_limit", "count_limit", "max_turns", "max_tokens",
                     "context_budget", "max_compactions", "step_raised")
"""Why a subagent call gave its caller an error result instead of an answer (the
``Thread.error_kind`` the caller can recover from; see ``agentrl.rollout.subagents``):

- ``depth_limit`` / ``count_limit``: the call would pass ``rollout.max_subagent_depth`` /
  ``rollout.max_subagents_per_rollout``, so no thread started;
- ``max_turns``: the thread used its turns without a final reply (it loops);
- ``max_tokens``: it generated its token budget (``rollout.max_subagent_tokens``);
- ``context_budget`` / ``max_compactions``: its context could not be compacted further;
- ``step_raised``: the thread's environment step raised (the call returned, so the
  instance is idle and the caller goes on, as after a tool that raised).

Any other environment or engine failure inside a subagent thread is not among them: it
makes the whole rollout invalid, and ``Thread.error_kind`` is its invalid kind
(``step_timeout``, ``bad_reward``, ...).
"""


class Spend(msgspec.Struct, omit_defaults=True):
    """What playing one rollout used (or, summed, several): the figures a price table
    turns into cost (``agentrl.observe.costs``). Counted over every thread of the
    rollout, compaction summaries included."""

    generation_s: float = 0.0
    """The rollout's share of the engine's busy seconds: each instant an engine request
    is in flight is shared out equally among the requests in flight then, so the shares of
    all rollouts add up to the seconds the engine had work (``agentrl.rollout.metering``)."""
    env_s: float = 0.0
    """Seconds the rollout's environment calls ran (construction, reset, steps and tools,
    grading, close), timed where the code runs: its thread, its worker process, or the
    await of a native ``astep`` (``agentrl.rollout.env_guard``)."""
    sandbox_s: float = 0.0
    """Wall seconds of sandboxed runs (``agentrl.sandbox.run_python``) inside those calls;
    part of ``env_s``."""
    num_generated_tokens: int = 0
    """Tokens the engine generated for the rollout (summaries included)."""
    num_prompt_tokens: int = 0
    """Prompt tokens sent with the rollout's engine requests: the whole context each time
    (what an API bills as input; an engine's prefix cache may recompute fewer)."""

    def add(self, other: Spend) -> None:
        """Accumulate another rollout's figures into these."""
        for field in Spend.__struct_fields__:
            setattr(self, field, getattr(self, field) + getattr(other, field))


class RolloutStats(msgspec.Struct, omit_defaults=True):
    """What happened during one rollout, for metrics and debugging.

    With subagents, the counts (turns, compactions, generated tokens, tool errors) are
    totals over every thread of the rollout; ``truncated``, ``truncation_reason`` and the
    error are the rollout's own (its main thread's, or the failure that masked it). Each
    :class:`Thread` keeps its own figures in ``Thread.stats``."""

    num_turns: int = 0
    num_compactions: int = 0
    num_generated_tokens: int = 0
    truncated: bool = False
    """The rollout hit a turn or token limit before the environment ended it."""
    error: str | None = None
    """Why the rollout is invalid (environment crash, timeout, ...), or, on a valid
    rollout, the policy-caused failure it is trained with (``agentrl.rollout.failures``);
    None when nothing failed."""
    error_kind: str | None = None
    """The short, stable kind of ``error`` (``step_raised``, ``bad_reward``, ...; see
    ``agentrl.rollout.env_contract.INVALID_KINDS``)."""
    tool_errors: dict[str, int] = {}
    """Counts of tool-call failures by kind (malformed_json, unknown_tool, timeout, ...)."""
    truncation_reason: str | None = None
    """Why a truncated rollout ended (one of TRUNCATION_REASONS); None when not truncated."""
    compactions: list[Compaction] = []
    """Every compaction, in order (``len(compactions) == num_compactions``)."""
    needed_facts: list[str] = []
    """What the task's answer needs from the conversation (``AgentEnv.needed_facts``);
    empty when the environment does not say."""
    num_drift: int = 0
    """Agent programs: requests that sent back an edited assistant message (drift that
    cannot be bridged: each started a new row instead of training on tokens the model did
    not generate)."""
    spend: Spend = msgspec.field(default_factory=Spend)
    """Engine, environment and sandbox time and tokens (the whole rollout's; a subagent
    thread's own ``Thread.stats`` leaves it empty)."""

    def harness_compactions(self) -> dict[str, int]:
        """An agent program's compactions by reason (empty for other rollouts)."""
        reasons: dict[str, int] = {}
        for compaction in self.compactions:
            if compaction.cause == "harness":
                reasons[compaction.strategy] = reasons.get(compaction.strategy, 0) + 1
        return reasons


class Thread(msgspec.Struct, omit_defaults=True):
    """One conversation of a rollout other than the main one (a subagent, or a branch of
    a harness session), as a node of the rollout's tree."""

    thread_id: str
    parent: str = MAIN_THREAD
    """The thread that started this one."""
    depth: int = 1
    """1 for a thread the main one started, 2 for its children, ..."""
    origin: str = ""
    """What started it, in words (e.g. the tool call)."""
    answer: str | None = None
    """What it returned to its parent; None when it returned nothing."""
    error: str | None = None
    """Why it failed, when it did."""
    error_kind: str | None = None
    """The short, stable kind of ``error``: a subagent failure the parent was told about
    (one of :data:`SUBAGENT_FAILURES`, e.g. ``max_turns``), or an environment failure that
    made the whole rollout invalid (``step_raised``, ...)."""
    stats: RolloutStats = msgspec.field(default_factory=RolloutStats)
    """This thread's own turns, compactions, generated tokens, tool errors, truncation."""


class Rollout(msgspec.Struct):
    """One attempt at one task: one reward, one validity, one or more segments."""

    rollout_id: str
    group_id: str
    env: str
    segments: list[Segment]
    reward: float
    valid: bool = True
    stats: RolloutStats = msgspec.field(default_factory=RolloutStats)
    reward_components: dict[str, float] = {}
    threads: list[Thread] = []
    """The rollout's threads besides the main one (empty: a single conversation). Every
    segment names its thread; segments of all threads are rows of this one rollout."""
    retry_of: str | None = None
    """The id of the first attempt when this rollout retried it after an infrastructure
    failure (same task, same group, a fresh environment: ``agentrl.rollout.failures``);
    None for a first attempt."""

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the policy produced over all segments."""
        return sum(segment.num_generated_tokens for segment in self.segments)

    @property
    def trainable(self) -> bool:
        """Whether the rollout trains: its validity, which every one of its rows carries
        (``Row.valid``; one bad row masks the whole rollout)."""
        return self.valid


class Group(msgspec.Struct):
    """The rollouts of one task, compared with each other for the baseline."""

    group_id: str
    env: str
    rollouts: list[Rollout]
    task_seed: int | None = None
    """The seed that fixed the group's task (None when unknown)."""


class Row(msgspec.Struct):
    """One trainable row: a segment plus a copy of its rollout's reward."""

    rollout_id: str
    group_id: str
    env: str
    segment: int
    """Index of the segment within its rollout (0 for the first)."""
    token_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the policy generated in this row."""
    logprobs: list[float]
    """Behaviour log-probs; 0.0 where loss_mask is 0."""
    reward: float
    valid: bool = True
    num_prompt_tokens: int = 0
    version_runs: list[tuple[int, int]] = []
    """The segment's policy versions, run-length encoded (see ``Segment.version_runs``)."""
    thread: str = MAIN_THREAD
    """The segment's thread (see ``Segment.thread``)."""

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the policy produced in this row."""
        return sum(self.loss_mask)

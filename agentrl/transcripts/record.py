"""One rollout as a transcript record: every row's tokens decoded into turns, with the
figures that explain its training signal (reward, per-row advantage, validity, truncation).

A row's tokens are its prompt (what the engine received when the row started: for rows
after the first, the compacted context), then alternating generated spans (the
assistant's turns, ``loss_mask`` 1) and observation spans (what the environment and the
template appended). Each span is decoded with the run's tokenizer and split into chat
messages by :mod:`agentrl.transcripts.chat_text`.

Policy versions come from each segment's ``version_runs`` (``agentrl.staleness``): per
generated span, per row and per rollout.

A rollout with subagents is a tree of threads (``Rollout.threads``): each row names its
thread, the record keeps the tree, and :func:`thread_blocks` orders the threads for
drawing (each subagent after its caller's rows, indented one level deeper).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import torch

from agentrl.staleness import token_versions
from agentrl.transcripts.chat_text import (
    ChatMessage,
    assistant_message,
    is_summary_request,
    split_messages,
)
from agentrl.types import MAIN_THREAD, Compaction, Rollout, Segment, Thread


class Span(msgspec.Struct, omit_defaults=True):
    """A stretch of a row from one source: "prompt", "generated" or "observation"."""

    source: str
    num_tokens: int
    messages: list[ChatMessage] = []
    summary: bool = False
    """A generated span that answers the compaction summary request."""
    policy_versions: list[int] = []
    """Policy versions that generated this span's tokens (when recorded)."""


class RowRecord(msgspec.Struct, omit_defaults=True):
    """One row (segment) of a rollout as trained, with its advantage."""

    index: int
    """The row's place in the rollout (segment index); within a thread, a row after the
    thread's first starts from a compacted context."""
    advantage: float
    """The advantage the trainer put on every generated token of this row."""
    num_tokens: int
    num_prompt_tokens: int
    num_generated_tokens: int
    valid: bool = True
    spans: list[Span] = []
    policy_versions: list[int] = []
    compaction: str | None = None
    """For a row after its thread's first: why it starts anew, in words (a compaction:
    cause, summary length, needed facts kept and lost; an agent program's request that did
    not extend its previous one; drift)."""
    thread: str = MAIN_THREAD
    """The thread (conversation) this row belongs to."""


class RolloutRecord(msgspec.Struct, omit_defaults=True):
    """A sampled rollout, one JSON line in ``RUN_DIR/rollouts/step_NNNNNN.jsonl``."""

    step: int
    env: str
    rollout_id: str
    group_id: str
    selection: str
    """Why it was sampled: "best", "worst" or "random" (within its environment)."""
    reward: float
    valid: bool
    num_turns: int
    num_compactions: int
    num_rows: int
    num_tokens: int
    num_generated_tokens: int
    invalid_reason: str | None = None
    truncated: bool = False
    truncation_reason: str | None = None
    tool_errors: dict[str, int] = {}
    reward_components: dict[str, float] = {}
    policy_versions: list[int] = []
    rows: list[RowRecord] = []
    needed_facts: list[str] = []
    """What the task's answer needs (``AgentEnv.needed_facts``), when declared."""
    threads: list[Thread] = []
    """The threads besides the main one (the tree: subagents, or an agent program's other
    conversations), as in ``Rollout.threads``."""
    compaction_reasons: dict[str, int] = {}
    """An agent program's compactions by reason (docs/harnesses.md)."""
    num_drift: int = 0
    """An agent program's requests that sent back an edited assistant message."""


class ThreadBlock(msgspec.Struct):
    """One thread of a record as drawn: its node (None for the main thread), its depth
    and its rows."""

    thread_id: str
    depth: int
    node: Thread | None
    rows: list[RowRecord]


def thread_blocks(record: RolloutRecord) -> list[ThreadBlock]:
    """The main thread, then depth first each subagent after its caller, in id order."""
    children: dict[str, list[Thread]] = {}
    for node in record.threads:
        children.setdefault(node.parent, []).append(node)
    blocks: list[ThreadBlock] = []

    def visit(thread_id: str, depth: int, node: Thread | None) -> None:
        rows = [r for r in record.rows if r.thread == thread_id]
        blocks.append(ThreadBlock(thread_id, depth, node, rows))
        for child in children.get(thread_id, []):
            visit(child.thread_id, depth + 1, child)

    visit(MAIN_THREAD, 0, None)
    return blocks


def build_record(
    rollout: Rollout, row_advantages: Mapping[int, float], tokenizer: Any, step: int,
    selection: str,
) -> RolloutRecord:
    """The transcript of one rollout; ``row_advantages``: segment index → advantage, as
    the trainer computed them (never recomputed here)."""
    stats = rollout.stats
    rows = [_row_record(index, segment, row_advantages.get(index, 0.0), tokenizer)
            for index, segment in enumerate(rollout.segments)]
    for compaction in stats.compactions:  # the runner's own: say what it kept
        if compaction.cause != "harness" and compaction.segment + 1 < len(rows):
            rows[compaction.segment + 1].compaction = compaction_note(
                compaction.segment + 1, compaction)
    return RolloutRecord(
        step=step, env=rollout.env, rollout_id=rollout.rollout_id, group_id=rollout.group_id,
        selection=selection, reward=float(rollout.reward), valid=rollout.trainable,
        num_turns=stats.num_turns, num_compactions=stats.num_compactions,
        num_rows=len(rows), num_tokens=sum(r.num_tokens for r in rows),
        num_generated_tokens=rollout.num_generated_tokens,
        invalid_reason=invalid_reason(rollout), truncated=stats.truncated,
        truncation_reason=stats.truncation_reason,
        tool_errors=dict(stats.tool_errors), reward_components=dict(rollout.reward_components),
        policy_versions=sorted({v for r in rows for v in r.policy_versions}), rows=rows,
        needed_facts=list(stats.needed_facts),
        threads=list(rollout.threads),
        compaction_reasons=stats.harness_compactions(), num_drift=stats.num_drift,
    )


CAUSES = {"tool": "the policy's compact call", "budget": "the context budget",
          "template": "the chat template's re-rendering"}


def compaction_note(row: int, compaction: Compaction) -> str:
    """"compaction 2 (by the context budget, summarize): row 2 starts from a compacted
    context · summary 12 tokens · kept 1 of 2 needed facts seen (lost: birch)"."""
    note = (f"compaction {row} (by {CAUSES.get(compaction.cause, compaction.cause)}, "
            f"{compaction.strategy}): row {row} starts from a compacted context")
    if compaction.summary is not None:
        note += f" · summary {compaction.summary_tokens} tokens"
    if compaction.facts_revealed:
        lost = [f for f in compaction.facts_revealed if f not in compaction.facts_kept]
        note += (f" · kept {len(compaction.facts_kept)} of {len(compaction.facts_revealed)} "
                 "needed facts seen")
        note += f" (lost: {', '.join(lost)})" if lost else " (all)"
    return note


def boundary_note(index: int, segment: Segment) -> str | None:
    """Why an agent program's request started row ``index`` (``Segment.boundary``): a
    harness compaction or drift, in words; None for any other row."""
    kind, _, reason = segment.boundary.partition(":")
    if kind == "harness_compaction":
        return (f"harness compaction ({reason}): row {index} starts where the program's "
                "request did not extend its previous one")
    if kind == "drift":
        return (f"drift ({reason.replace('_', ' ')}): row {index} starts anew; the edited "
                "text is prompt here, never trained")
    return None


def invalid_reason(rollout: Rollout) -> str | None:
    """Why a rollout is masked: its error ("<kind>: <message>" when the kind is named), or
    "marked invalid" when it has none; None if valid."""
    stats = rollout.stats
    if stats.error:
        return f"{stats.error_kind}: {stats.error}" if stats.error_kind else stats.error
    if not rollout.trainable:
        return "marked invalid"
    return None


def policy_versions(segment: Segment, start: int = 0, end: int | None = None) -> list[int]:
    """Distinct policy versions of the generated tokens in ``segment[start:end]``, from its
    ``version_runs``; [] when none is recorded."""
    if not segment.version_runs:
        return []
    versions = token_versions(segment.version_runs, len(segment.token_ids), -1)[start:end]
    generated = torch.tensor(segment.loss_mask[start:end], dtype=torch.bool)
    return sorted({v for v in versions[generated].tolist() if v >= 0})


def _row_record(index: int, segment: Segment, advantage: float, tokenizer: Any) -> RowRecord:
    spans = []
    previous: Span | None = None
    for source, start, end in _spans(segment):
        text = tokenizer.decode(segment.token_ids[start:end])
        if source == "generated":
            messages = [assistant_message(text)]
            versions = policy_versions(segment, start, end)
        else:
            messages, versions = split_messages(text), []
        summary = (source == "generated" and previous is not None
                   and previous.source == "observation"
                   and is_summary_request(previous.messages))
        previous = Span(source, end - start, messages, summary, versions)
        spans.append(previous)
    return RowRecord(
        index=index, advantage=float(advantage), num_tokens=len(segment.token_ids),
        num_prompt_tokens=segment.num_prompt_tokens,
        num_generated_tokens=segment.num_generated_tokens, spans=spans,
        policy_versions=policy_versions(segment), thread=segment.thread,
        compaction=boundary_note(index, segment),
    )


def _spans(segment: Segment) -> list[tuple[str, int, int]]:
    """(source, start, end) of the prompt and of each run of generated / observation tokens."""
    out = [("prompt", 0, segment.num_prompt_tokens)] if segment.num_prompt_tokens else []
    mask = segment.loss_mask
    start = segment.num_prompt_tokens
    for i in range(start + 1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append(("generated" if mask[start] else "observation", start, i))
            start = i
    return out

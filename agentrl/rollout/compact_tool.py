"""Compaction the policy decides (``compaction.strategy = "tool"``): a ``compact`` tool.

The policy is offered one tool beside the environment's, ``compact(summary)``. A reply
that calls it ends the current segment (row) there, its tokens, the summary included,
trained in that row like any generated text; the rollout continues from a fresh context:
the head (system + task), the summary, and the last ``keep_last_turns`` turns before the
call. The environment never sees the call (it is not a step of the task). The budget
still forces a compaction with ``compaction.fallback`` when the policy has not compacted
in time; both kinds count against ``compaction.max_compactions``.

A ``compact`` call without a non-empty string ``summary`` does not compact: the policy
gets a tool error message instead (counted under ``tool_errors/invalid_arguments``), so
it can retry. Other tool calls in the same reply are not run (``compact_not_alone``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentrl.envs.tools import HermesParser, ToolCall
from agentrl.rollout.env_contract import EnvError

COMPACT_TOOL = "compact"
COMPACT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": COMPACT_TOOL,
        "description": "Replace your context with a summary of what the task still needs.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {
                "type": "string",
                "description": "Facts found so far and what is left to do.",
            }},
            "required": ["summary"],
        },
    },
}
"""The schema the chat template renders beside the environment's tools."""


class CompactRequest(msgspec.Struct, frozen=True):
    """A reply's ``compact`` call: its summary, or why it cannot compact."""

    summary: str | None = None
    error: str | None = None
    """A tool error message for the policy when the call is unusable."""
    num_other_calls: int = 0
    """Other tool calls in the same reply (not run)."""


def find_compact_call(text: str, parser: Any | None = None) -> CompactRequest | None:
    """The reply's ``compact`` call, or None when it makes none (Hermes format unless
    another parser is given)."""
    calls = (parser or HermesParser()).parse(text)
    named = [c for c in calls if c.name == COMPACT_TOOL]
    if not named:
        return None
    others = len(calls) - 1
    call = named[0]
    summary = call.arguments.get("summary") if isinstance(call, ToolCall) else None
    if not isinstance(summary, str) or not summary.strip():
        return CompactRequest(error=(
            "Error (invalid_arguments): compact needs a non-empty string argument "
            '"summary"; nothing was compacted'), num_other_calls=others)
    return CompactRequest(summary=summary.strip(), num_other_calls=others)


def offered_tools(strategy: str, env_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool schemas the policy sees: the environment's, plus ``compact`` under the
    tool strategy."""
    return [*env_tools, COMPACT_SCHEMA] if strategy == "tool" else list(env_tools)


def check_tool_names(env_name: str, schemas: list[dict[str, Any]]) -> None:
    """Refuse an environment whose own tools already include ``compact`` (the rollout
    is invalid, ``bad_tool_schemas``; ``agentrl plan`` says it before launch)."""
    for schema in schemas:
        if (schema.get("function") or {}).get("name") == COMPACT_TOOL:
            raise EnvError("bad_tool_schemas",
                f'environment {env_name!r} has a tool named "{COMPACT_TOOL}", which '
                'compaction.strategy = "tool" offers to the policy itself; rename the '
                "environment's tool or choose another compaction strategy")

"""What several tool-call formats share: reading JSON values one after another."""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.tools import ToolCall, ToolCallError, call_from_object, call_of

_DECODER = json.JSONDecoder()


def json_values(text: str, separators: str = " \t\r\n;,") -> tuple[list[Any], str | None]:
    """The JSON values written one after another in ``text`` (separated by whitespace,
    ``;`` or ``,``), and why reading stopped early (None when all of it was read)."""
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        if pos == len(text):
            return values, None
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            return values, f"the tool call is not valid JSON ({exc})"
        values.append(value)


def calls_from_json(text: str) -> list[ToolCall | ToolCallError]:
    """Calls written as JSON objects (or lists of them) one after another; a value that
    does not decode ends the list with a ``malformed_json`` error."""
    values, error = json_values(text)
    calls: list[ToolCall | ToolCallError] = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        calls.extend(call_from_object(item) for item in items)
    if error is not None:
        calls.append(ToolCallError("malformed_json", error))
    return calls


def named_call(name: str, arguments: str) -> ToolCall | ToolCallError:
    """A call whose name and JSON arguments are written apart (DeepSeek, harmony)."""
    name = name.strip()
    if not name:
        return ToolCallError("malformed_call", "the tool call names no function")
    return call_of(name, arguments)


def dumps(arguments: dict[str, Any]) -> str:
    """Arguments as the templates write them (``tojson``: ``json.dumps`` defaults)."""
    return json.dumps(arguments, ensure_ascii=False)

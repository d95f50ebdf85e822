"""Mistral tool calls, after the ``[TOOL_CALLS]`` token, in either of its two layouts:

- a JSON list (Mistral-7B-Instruct v0.3, Mistral-Nemo, Mistral-Small up to 3.1):
  ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- name then arguments (tokenizer v11+: Mistral-Small 3.2, Magistral, Devstral):
  ``[TOOL_CALLS]NAME[ARGS]{...}``, one ``[TOOL_CALLS]`` per call.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.parsers.common import calls_from_json, json_values, named_call
from agentrl.envs.tools import ToolCall, ToolCallError

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


class MistralParser:
    """Mistral's ``[TOOL_CALLS]`` calls (both layouts)."""

    name = "mistral"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """Every call after the first ``[TOOL_CALLS]``; none without it."""
        start = text.find(TOOL_CALLS)
        if start == -1:
            return []
        rest = text[start + len(TOOL_CALLS):].lstrip()
        if rest.startswith(("[", "{")):
            return calls_from_json(rest)
        return [self._named(chunk) for chunk in rest.split(TOOL_CALLS) if chunk.strip()]

    def _named(self, chunk: str) -> ToolCall | ToolCallError:
        name, sep, arguments = chunk.partition(ARGS)
        if not sep:
            return ToolCallError("malformed_call",
                                 f"{TOOL_CALLS}{name.strip()[:40]} has no {ARGS} after the name")
        values, error = json_values(arguments)
        if error is not None or len(values) != 1:
            return ToolCallError("malformed_json", error or "expected one JSON object of "
                                 f"arguments after {ARGS}", name.strip() or None)
        return named_call(name, json.dumps(values[0]))

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """``[TOOL_CALLS][{"name": NAME, "arguments": {...}}]`` (the JSON-list layout)."""
        body = json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)
        return f"{TOOL_CALLS}{body}"

"""Qwen3-Coder's XML tool calls::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are written as text; each is converted by the type its tool's schema gives it
(``string`` stays text; ``integer``, ``number``, ``boolean``, ``object``, ``array`` are
read), as vLLM's ``qwen3_coder`` parser does. Without a schema a value that reads as JSON
is taken as that value, else as text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.envs.tools import ToolCall, ToolCallError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


class Qwen3CoderParser:
    """Qwen3-Coder's ``<function=...>`` calls; ``schemas``: each tool's JSON parameters
    schema by tool name (the environment's tools), to type the values."""

    name = "qwen3_coder"

    def __init__(self, schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self.schemas = schemas or {}

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """Every ``<tool_call>`` block; an unclosed last one is ``malformed_call``."""
        calls: list[ToolCall | ToolCallError] = []
        pos = 0
        while (start := text.find(OPEN, pos)) != -1:
            end = text.find(CLOSE, start)
            if end == -1:
                calls.append(ToolCallError("malformed_call", f"{OPEN} is never closed by {CLOSE}"))
                break
            calls.append(self._call(text[start + len(OPEN):end]))
            pos = end + len(CLOSE)
        return calls

    def _call(self, block: str) -> ToolCall | ToolCallError:
        match = _FUNCTION.search(block)
        if match is None or not match.group(1).strip():
            return ToolCallError("malformed_call", "a tool call must hold <function=NAME>")
        name = match.group(1).strip()
        if "</function>" not in block:
            return ToolCallError("malformed_call", f"<function={name}> is never closed", name)
        types = self.schemas.get(name, {}).get("properties", {})
        arguments: dict[str, Any] = {}
        for key, raw in _PARAMETER.findall(match.group(2)):
            value = raw[1:] if raw.startswith("\n") else raw
            value = value[:-1] if value.endswith("\n") else value
            arguments[key.strip()] = typed(value, types.get(key.strip(), {}).get("type"))
        return ToolCall(name, arguments)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """The XML block, values written as Qwen3-Coder's template writes them (objects
        and lists as JSON, everything else as its text)."""
        lines = [OPEN, f"<function={name}>"]
        for key, value in arguments.items():
            text = json.dumps(value) if isinstance(value, dict | list) else str(value)
            lines += [f"<parameter={key}>", text, "</parameter>"]
        return "\n".join([*lines, "</function>", CLOSE])


def typed(value: str, kind: Any) -> Any:
    """A parameter's text as its schema type (JSON when the schema gives none); text that
    does not read as that type stays text (the argument check then names it)."""
    if kind == "string":
        return value
    if kind in ("boolean", None) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    if kind == "number" and isinstance(parsed, int | float) and not isinstance(parsed, bool):
        return float(parsed) if not float(parsed).is_integer() else parsed
    return parsed

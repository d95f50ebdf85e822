"""DeepSeek-V3's tool-call tokens (also R1 and V3-0324), and V3.1's shorter layout:

- V3: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` newline
  ```` ```json ```` newline, the JSON arguments, newline ```` ``` ````
  ``<｜tool▁call▁end｜>`` ... ``<｜tool▁calls▁end｜>``;
- V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` inside the same
  outer pair.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.parsers.common import dumps, named_call
from agentrl.envs.tools import ToolCall, ToolCallError

CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"
FENCE = "```json\n"


class DeepSeekV3Parser:
    """DeepSeek-V3's calls (the V3 and V3.1 layouts)."""

    name = "deepseek_v3"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """Every call after ``<｜tool▁calls▁begin｜>``; none without it."""
        start = text.find(CALLS_BEGIN)
        if start == -1:
            return []
        calls: list[ToolCall | ToolCallError] = []
        pos = start + len(CALLS_BEGIN)
        while (begin := text.find(CALL_BEGIN, pos)) != -1:
            end = text.find(CALL_END, begin)
            if end == -1:
                calls.append(ToolCallError("malformed_call",
                                           f"{CALL_BEGIN} is never closed by {CALL_END}"))
                break
            calls.append(self._call(text[begin + len(CALL_BEGIN):end]))
            pos = end + len(CALL_END)
        return calls

    def _call(self, body: str) -> ToolCall | ToolCallError:
        left, sep, right = body.partition(SEP)
        if not sep:
            return ToolCallError("malformed_call", f"the call has no {SEP}")
        name, fence, arguments = right.partition(FENCE)
        if not fence:  # V3.1: NAME<sep>{...}
            return named_call(left, right)
        arguments = arguments.rstrip()
        if not arguments.endswith("```"):
            return ToolCallError("malformed_call", "the ```json block is never closed",
                                 name.strip() or None)
        return named_call(name, arguments[:-3])

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call in the V3 layout, inside the outer begin/end tokens."""
        return (f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{name}\n{FENCE}{dumps(arguments)}"
                f"\n```{CALL_END}{CALLS_END}")

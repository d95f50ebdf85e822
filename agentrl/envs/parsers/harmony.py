"""gpt-oss's harmony format: a tool call is a message on the ``commentary`` channel
addressed ``to=functions.NAME``, its body the JSON arguments, ended by ``<|call|>``:

``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``

The recipient may also sit in the role header (``<|start|>assistant to=functions.NAME
<|channel|>commentary json<|message|>...``). Messages to other recipients (built-in
``browser.*`` or ``python`` tools) and the ``analysis`` / ``final`` channels are not
function calls, as in vLLM's ``openai`` tool parser.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.envs.parsers.common import dumps, named_call
from agentrl.envs.tools import ToolCall, ToolCallError

START, CHANNEL, MESSAGE, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
ENDS = ("<|end|>", CALL, "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyParser:
    """gpt-oss's calls: ``to=functions.NAME`` messages."""

    name = "harmony"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """One call per message addressed to a function, in order."""
        calls: list[ToolCall | ToolCallError] = []
        for message in text.split(START):
            header, sep, body = message.partition(MESSAGE)
            match = _RECIPIENT.search(header if sep else message)
            if match is None:
                continue
            if not sep:
                calls.append(ToolCallError("malformed_call", f"the call to {match.group(1)} "
                                           f"has no {MESSAGE} body", match.group(1)))
                continue
            cut = min((i for i in (body.find(e) for e in ENDS) if i != -1), default=len(body))
            calls.append(named_call(match.group(1), body[:cut]))
        return calls

    def message_text(self, text: str) -> str:
        """What a reply says to the user: the body of its last ``final`` message (the
        text without channel markup when it has none), as the template takes it."""
        for message in reversed(text.split(START)):
            header, sep, body = message.partition(MESSAGE)
            if sep and "final" in header:
                cut = min((i for i in (body.find(e) for e in ENDS) if i != -1),
                          default=len(body))
                return body[:cut]
        return re.sub(r"<\|[a-z]+\|>", "", text)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """The commentary message of one call, closed by ``<|call|>``."""
        return (f"{CHANNEL}commentary to=functions.{name} <|constrain|>json{MESSAGE}"
                f"{dumps(arguments)}{CALL}")

"""Decoded template text back into chat messages, tool calls, tool results and notes.

A segment is token ids; decoded, its prompt and observation spans are chat-template text
(``<|im_start|>user\\n...<|im_end|>`` for ChatML/Qwen, ``<|start_header_id|>user
<|end_header_id|>\\n\\n...<|eot_id|>`` for Llama 3). This module splits such text into
messages so renderers can show chat bubbles; text in any other format stays one raw
message. Tool calls are found in generated text in the Hermes format
(``<tool_call>...</tool_call>``, the default parser); Qwen's ``<tool_response>`` blocks in
a user message become one ``tool`` message each. Compaction leaves notes in the context
(the drop_oldest marker, the summary request, the summary carried into the next row);
they are tagged so renderers can mark them.

Everything format-specific lives here: the JSONL records and both renderers only see
roles and tagged parts.
"""

from __future__ import annotations

import re

import msgspec

from agentrl.rollout.compaction import SUMMARY_REQUEST

_ROLE_PATTERNS = (
    # ChatML (Qwen, the tiny checkpoints): the end tag may be missing at the span's end
    re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.S),
    # Llama 3
    re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)"
               r"(?:<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)", re.S),
)
_TOOL_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?(?:</tool_response>|\Z)", re.S)
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>")
_NOTE_PATTERNS = (
    re.compile(r"^\[\d+ earlier turn\(s\) were removed to fit the context window\.\]$"),
    re.compile(r"^Summary of your earlier progress:\n", re.S),
    re.compile(re.escape(SUMMARY_REQUEST)),
)


class Part(msgspec.Struct):
    """A piece of a message: ``kind`` is "text", "tool_call" or "note" (compaction)."""

    kind: str
    text: str


class ChatMessage(msgspec.Struct, omit_defaults=True):
    """One message as decoded: its role and its tagged parts."""

    role: str
    """"system", "user", "assistant", "tool", or "text" for text in no known format."""
    parts: list[Part] = []

    @property
    def text(self) -> str:
        """The message's whole text."""
        return "".join(part.text for part in self.parts)


def split_messages(text: str) -> list[ChatMessage]:
    """Template text as messages; empty messages (a bare generation prompt) are dropped."""
    for pattern in _ROLE_PATTERNS:
        matches = list(pattern.finditer(text))
        if matches:
            out: list[ChatMessage] = []
            for match in matches:
                out.extend(_message(match.group(1), match.group(2)))
            return out
    stripped = text.strip()
    return [ChatMessage("text", [Part("text", stripped)])] if stripped else []


def _message(role: str, content: str) -> list[ChatMessage]:
    if role == "user" and content.lstrip().startswith("<tool_response>"):
        return [ChatMessage("tool", [Part("text", body)])
                for body in _TOOL_RESPONSE.findall(content)]
    if role in ("ipython", "tool"):
        return [ChatMessage("tool", [Part("text", content)])]
    if not content.strip():
        return []
    kind = "note" if any(p.search(content) for p in _NOTE_PATTERNS) else "text"
    return [ChatMessage(role, [Part(kind, content)])]


def assistant_message(text: str) -> ChatMessage:
    """Generated text as an assistant message, tool calls split out as their own parts."""
    for marker in _END_MARKERS:
        if text.endswith(marker):
            text = text[: -len(marker)]
            break
    parts: list[Part] = []
    pos = 0
    for match in _TOOL_CALL.finditer(text):
        if match.start() > pos:
            parts.append(Part("text", text[pos:match.start()]))
        parts.append(Part("tool_call", match.group(0)))
        pos = match.end()
    if pos < len(text) or not parts:
        parts.append(Part("text", text[pos:]))
    return ChatMessage("assistant", parts)


def is_summary_request(messages: list[ChatMessage]) -> bool:
    """True when an observation asks the policy for a compaction summary."""
    return any(SUMMARY_REQUEST in m.text for m in messages)

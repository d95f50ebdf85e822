"""How a checkpoint's chat template is fed a tool conversation: which tool-call format
its model writes, whether calls go to the template as text or as ``tool_calls``, and the
extra variables it is rendered with (``model.chat_template_kwargs``).

Templates that render an assistant's text verbatim (Qwen, Hermes, Llama, DeepSeek) get
the reply as ``content``. Templates that refuse a tool message without a structured call
before it (gpt-oss's harmony, Mistral's role alternation and 9-character call ids) get
the calls the reply holds as ``tool_calls``, with ids the following tool messages answer
(``tool_call_id``). The run picks this once at load time
(:func:`agentrl.rollout.template_check.prepare_chat`) and sets it on the tokenizer as
``chat_style``; every :class:`~agentrl.rollout.context.ChatContext` reads it there.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentrl.envs.parsers import make_parser
from agentrl.envs.tools import ToolCall


class ChatStyle(msgspec.Struct, frozen=True):
    """The model's tool-call format and how its template takes calls."""

    tool_format: str = "hermes"
    """A name of ``agentrl.envs.parsers.PARSERS``."""
    structured: bool = False
    """Calls go to the template as ``tool_calls`` (True) or as the reply's text."""
    template_kwargs: dict[str, Any] = {}
    """Extra variables every rendering passes (``model.chat_template_kwargs``)."""


def style_of(tokenizer: Any) -> ChatStyle:
    """The style the run set on this tokenizer; text calls in Hermes format otherwise."""
    style = getattr(tokenizer, "chat_style", None)
    return style if isinstance(style, ChatStyle) else ChatStyle()


def call_id(index: int) -> str:
    """The id of a conversation's ``index``-th call: 9 alphanumeric characters (the
    length Mistral's templates require)."""
    return f"call{index:05d}"


def structured_turn(style: ChatStyle, content: str, observation: list[dict[str, Any]],
                    num_calls_before: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assistant message and observation for the template: with the reply's calls
    as ``tool_calls`` (ids numbered after ``num_calls_before``) and the tool messages
    that answer them carrying their ids, when the style asks for it."""
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if not style.structured:
        return assistant, observation
    parser = make_parser(style.tool_format)
    calls = [c for c in parser.parse(content) if isinstance(c, ToolCall)]
    if not calls:
        text = getattr(parser, "message_text", None)  # harmony: the final channel's text
        return ({**assistant, "content": text(content)} if text else assistant,
                answer_calls(observation, []))
    ids = [call_id(num_calls_before + k) for k in range(len(calls))]
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in zip(ids, calls, strict=True)]}
    return assistant, answer_calls(observation, ids)


def answer_calls(observation: list[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """Tool messages answering the calls ``ids`` in order carry their ids; a tool message
    that answers no call (an error for a call that could not be read) goes to the
    template as a user message, which such templates accept."""
    answered, pending = [], list(ids)
    for message in observation:
        if message.get("role") == "tool":
            message = ({**message, "tool_call_id": pending.pop(0)} if pending else
                       {"role": "user", "content": message.get("content", "")})
        answered.append(message)
    return answered


def num_calls(messages: list[dict[str, Any]]) -> int:
    """Structured calls in a conversation so far (to number the next ones)."""
    return sum(len(m.get("tool_calls") or ()) for m in messages)


def stop_ids_of(tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a model turn: the tokenizer's ``stop_token_ids`` (EOS and the
    checkpoint's other end-of-turn ids), or its EOS alone."""
    return tuple(getattr(tokenizer, "stop_token_ids", None) or (tokenizer.eos_token_id,))

"""OpenAI's chat-completions wire format, as the endpoint for agent programs speaks it.

Requests are checked and turned into :class:`ChatRequest` (messages in the form chat
templates read: text content, tool-call arguments as objects); answers are
``chat.completion`` objects (or, with ``stream``, ``chat.completion.chunk`` server-sent
events ending in ``data: [DONE]``); every refusal is a :class:`ChatError` whose body is
OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``, so the official
clients raise their usual exceptions (``BadRequestError``, ``NotFoundError``, ...).

Tool calls come from the generated text by the Hermes parser of ``agentrl.envs.tools``
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``); text whose calls cannot be
read is returned as plain content, as the OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from agentrl.engines.request_checks import check_depth, number, stop_strings
from agentrl.envs.tools import HermesParser, ToolCall

ROLES = {"system": "system", "developer": "system", "user": "user",
         "assistant": "assistant", "tool": "tool"}
"""Accepted roles and the role each is rendered as ("developer" is OpenAI's newer name
for the system message)."""


class ChatError(Exception):
    """A request the endpoint refuses, as an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


class ChatRequest(msgspec.Struct, kw_only=True):
    """One checked ``/v1/chat/completions`` request."""

    model: str
    messages: list[dict[str, Any]]
    """Template-ready: role, text content, ``tool_calls`` with arguments as objects,
    ``tool_call_id`` and ``name`` where given."""
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False


def parse_chat_request(body: Any) -> ChatRequest:
    """The checked request; ChatError (400) naming the offending field otherwise."""
    if not isinstance(body, dict):
        raise ChatError(400, "invalid_body", "the request body must be a JSON object")
    _checked(check_depth, body, "the request body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ChatError(400, "missing_model", "'model' must be a non-empty string", "model")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ChatError(400, "invalid_messages", "'messages' must be a non-empty list of "
                        "message objects", "messages")
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    if body.get("n") not in (None, 1):
        raise ChatError(400, "unsupported_n", f"n = {body['n']!r}: this endpoint returns one "
                        "choice per request; send several requests instead", "n")
    stop = _checked(stop_strings, body.get("stop"), param="stop")
    options = body.get("stream_options") or {}
    return ChatRequest(
        model=model, messages=messages, tools=_tools(body.get("tools")),
        max_tokens=_number(body, "max_completion_tokens", int)
        or _number(body, "max_tokens", int),
        temperature=_number(body, "temperature", float), top_p=_number(body, "top_p", float),
        seed=_number(body, "seed", int), stop=tuple(stop), stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        logprobs=bool(body.get("logprobs")))


def _number(body: dict[str, Any], name: str, kind: type) -> Any:
    return _checked(number, body, name, kind, param=name)


def _checked(check: Callable[..., Any], *args: Any, param: str | None = None) -> Any:
    """``check(*args)``, its ValueError as a 400 naming ``param``."""
    try:
        return check(*args)
    except ValueError as exc:
        raise ChatError(400, "invalid_parameter", str(exc), param) from None


def _message(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ChatError(400, "invalid_message", f"{where} must be an object", where)
    role = ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise ChatError(400, "invalid_role", f"{where}.role = {raw.get('role')!r}; use one "
                        f"of {sorted(ROLES)}", f"{where}.role")
    message: dict[str, Any] = {"role": role, "content": _text(raw.get("content"), where)}
    if role == "assistant" and raw.get("tool_calls"):
        message["tool_calls"] = _tool_calls(raw["tool_calls"], where)
    for key in ("tool_call_id", "name"):
        if isinstance(raw.get(key), str):
            message[key] = raw[key]
    if role == "tool" and "tool_call_id" not in message:
        raise ChatError(400, "missing_tool_call_id", f"{where} is a tool message without "
                        "'tool_call_id'", f"{where}.tool_call_id")
    return message


def _text(content: Any, where: str) -> str:
    """Text content: a string, null (an assistant message with tool calls), or text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ChatError(400, "unsupported_content", f"{where}.content holds a part "
                                f"{str(part)[:80]!r}; only text parts are served",
                                f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise ChatError(400, "invalid_content", f"{where}.content must be a string or a list "
                    "of text parts", f"{where}.content")


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ChatError(400, "invalid_tool_calls", f"{where}.tool_calls must be a list",
                        f"{where}.tool_calls")
    calls = []
    for i, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
            check_depth(decoded, "arguments")
        except (ValueError, RecursionError):
            decoded = None
        if not isinstance(name, str) or not isinstance(decoded, dict):
            raise ChatError(400, "invalid_tool_calls", f"{where}.tool_calls[{i}] must be "
                            '{"id", "type": "function", "function": {"name": str, '
                            '"arguments": a JSON object as a string}}', f"{where}.tool_calls")
        calls.append({"id": str(call.get("id", "")), "type": "function",
                      "function": {"name": name, "arguments": decoded}})
    return calls


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None or raw == []:
        return None
    if not (isinstance(raw, list) and all(
            isinstance(t, dict) and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in raw)):
        raise ChatError(400, "invalid_tools", "'tools' must be a list of "
                        '{"type": "function", "function": {"name", "description", '
                        '"parameters"}}', "tools")
    return raw


def assistant_reply(text: str, call_ids: Iterator[str]) -> dict[str, Any]:
    """The assistant message for generated text (without its end-of-turn token): the
    text outside ``<tool_call>`` blocks as content, each call as an OpenAI tool call."""
    parser = HermesParser()
    calls = parser.parse(text)
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        return {"role": "assistant", "content": text}
    content = text[:text.find(parser.open_tag)].strip()
    return {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": next(call_ids), "type": "function",
         "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for c in calls if isinstance(c, ToolCall)]}


def reply_key(message: dict[str, Any]) -> str:
    """What identifies an assistant message the harness sends back: its text and its
    calls (names and decoded arguments), never the call ids (clients may rewrite them)."""
    calls = []
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        calls.append([call["function"]["name"], arguments])
    return json.dumps([(message.get("content") or "").strip(), calls], sort_keys=True)


def finish_reason(reply: dict[str, Any], engine_reason: str) -> str:
    """OpenAI's finish reason: "tool_calls" when the reply calls tools."""
    return "tool_calls" if reply.get("tool_calls") else engine_reason


def completion_body(request_id: str, model: str, reply: dict[str, Any], finish: str,
                    usage: dict[str, int], logprobs: list[dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish,
                              "logprobs": None if logprobs is None else {"content": logprobs}}
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage}


def stream_events(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A completion as ``chat.completion.chunk`` events: the role and content, the tool
    calls, the finish reason, the usage when asked, then ``[DONE]``."""
    choice = body["choices"][0]
    reply = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
            "model": body["model"]}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": reply.get("content")
                                     or ""}]
    if reply.get("tool_calls"):
        deltas.append({"tool_calls": [{"index": i, **call}
                                      for i, call in enumerate(reply["tool_calls"])]})
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None,
                                    "logprobs": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {},
                                        "finish_reason": choice["finish_reason"],
                                        "logprobs": choice["logprobs"]}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]

"""Tools: the ``@tool`` decorator, JSON schemas, tool-call parsing and safe execution.

An environment method decorated with ``@tool`` is offered to the model as an OpenAI-style
function schema (``{"type": "function", "function": {name, description, parameters}}``),
derived from its type hints and the ``Args:`` section of its docstring. The schemas go to
the chat template's ``tools`` argument.

The model calls tools in its text. A :class:`ToolCallParser` turns that text into
:class:`ToolCall` objects or :class:`ToolCallError` objects; the default
:class:`HermesParser` reads the Hermes/Qwen format
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Every failure (malformed JSON,
unknown tool, wrong argument types, an exception or a timeout inside the tool) becomes a
``role="tool"`` error message for the model and a count under its kind, never an exception:
a rollout must not crash because the policy wrote bad text.

Error kinds (the keys of ``info["tool_errors"]``): ``malformed_json``, ``malformed_call``,
``unknown_tool``, ``invalid_arguments``, ``tool_exception``, ``timeout``, ``too_many_calls``.

Whatever comes back (a result, an error echoing the model's text) is valid UTF-8 (lone
surrogates from JSON escapes replaced) and at most ``max_output_chars`` characters, cut
with a marker: a tool message can never break the tokenizer or flood the context.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import re
import threading
import typing
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from agentrl.text import brief, clip, exception_message, short_repr, valid_utf8
from agentrl.types import Message

ERROR_KINDS = (
    "malformed_json",
    "malformed_call",
    "unknown_tool",
    "invalid_arguments",
    "tool_exception",
    "timeout",
    "too_many_calls",
)

_TOOL_ATTR = "__agentrl_tool__"
MAX_OUTPUT_CHARS = 16_000
"""Default cap on one tool message's characters (``AgentEnv.max_tool_output_chars``)."""
MAX_ERROR_CHARS = 1_000
"""Cap on an error message, which may echo the model's text."""


class ToolSpec(msgspec.Struct, frozen=True):
    """What ``@tool`` records about a function: its name, schema and time limit."""

    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float | None = None
    """Seconds one call may take; None: the environment's ``tool_timeout_s``."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema for chat templates."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def tool(fn: Callable | None = None, *, name: str | None = None,
         timeout_s: float | None = None) -> Any:
    """Mark a method as a tool offered to the model; usable bare or with arguments."""

    def mark(func: Callable) -> Callable:
        setattr(func, _TOOL_ATTR, build_spec(func, name=name, timeout_s=timeout_s))
        return func

    return mark(fn) if fn is not None else mark


def build_spec(func: Callable, name: str | None = None,
               timeout_s: float | None = None) -> ToolSpec:
    """Derive a ToolSpec from a function's signature, type hints and docstring."""
    hints = typing.get_type_hints(func)
    summary, arg_docs = parse_docstring(inspect.getdoc(func) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name not in hints:
            raise ValueError(
                f"tool {func.__name__}: parameter {param.name!r} has no type hint; "
                "add one so its JSON schema can be derived"
            )
        prop = dict(msgspec.json.schema(hints[param.name]))
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    if not summary:
        code = func.__code__
        warnings.warn_explicit(
            f"tool {name or func.__name__}: no docstring, so the model is offered an empty "
            "description; add a docstring (a first line saying what the tool does, and an "
            "Args: section describing each parameter)",
            UserWarning, code.co_filename, code.co_firstlineno)
    return ToolSpec(name or func.__name__, summary, parameters, timeout_s)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and ``Args:`` descriptions."""
    summary_lines: list[str] = []
    args: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if re.fullmatch(r"[A-Z][A-Za-z ]*:", stripped):
            section = "args" if stripped in ("Args:", "Arguments:", "Parameters:") else "other"
            continue
        if section == "summary":
            summary_lines.append(stripped)
        elif section == "args" and stripped:
            match = re.match(r"(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
            if match and line.startswith(" " * 4) and not line.startswith(" " * 8):
                current = match.group(1)
                args[current] = match.group(3)
            elif current is not None:  # a continuation line of the previous argument
                args[current] = f"{args[current]} {stripped}".strip()
    summary = " ".join(" ".join(summary_lines).split())
    return summary, args


class BoundTool(msgspec.Struct, frozen=True):
    """A tool spec together with the bound method that runs it."""

    spec: ToolSpec
    fn: Callable[..., Any]


def collect_tools(obj: Any) -> dict[str, BoundTool]:
    """Every ``@tool`` method of an object, by tool name, in definition order."""
    return {spec.name: BoundTool(spec, getattr(obj, attr))
            for attr, spec in marked_methods(type(obj), _TOOL_ATTR, ToolSpec)}


@functools.cache
def marked_methods(klass: type, marker: str, kind: type) -> tuple[tuple[str, Any], ...]:
    """(attribute, spec) of every method of ``klass`` that a decorator marked with a
    ``kind`` spec under ``marker``, base classes first (a later one of the same name
    wins where callers key them); found once per class (every rollout builds one)."""
    return tuple((attr, getattr(value, marker)) for base in reversed(klass.__mro__)
                 for attr, value in vars(base).items()
                 if isinstance(getattr(value, marker, None), kind))


# --------------------------------------------------------------------------- parsing


class ToolCall(msgspec.Struct, frozen=True):
    """One well-formed call the model asked for."""

    name: str
    arguments: dict[str, Any]


class ToolCallError(msgspec.Struct, frozen=True):
    """A call the model tried to write but that could not be read."""

    kind: str
    """One of ERROR_KINDS."""
    message: str
    name: str | None = None


class ToolCallParser(Protocol):
    """Turns model text into calls, and calls into model text; plug another format in by
    implementing both (``agentrl.envs.parsers`` holds one per model family)."""

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """All calls in the text, in order; an empty list means a plain answer."""
        ...

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call as the model writes it (for scripted ``demonstrate`` policies)."""
        ...


class HermesParser:
    """Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """Every tagged block; an unclosed last block is reported as malformed."""
        results: list[ToolCall | ToolCallError] = []
        pos = 0
        while (start := text.find(self.open_tag, pos)) != -1:
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end == -1:
                results.append(ToolCallError(
                    "malformed_call", f"{self.open_tag} is never closed by {self.close_tag}"
                ))
                break
            results.append(decode_call(text[body_start:end]))
            pos = end + len(self.close_tag)
        return results

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """``<tool_call>``, the JSON call on its own line, ``</tool_call>``."""
        body = json.dumps({"name": name, "arguments": arguments})
        return f"{self.open_tag}\n{body}\n{self.close_tag}"


def decode_call(body: str) -> ToolCall | ToolCallError:
    """Decode one JSON call object, accepting arguments that were encoded twice."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return ToolCallError("malformed_json", f"the tool call is not valid JSON ({exc})")
    return call_from_object(obj)


def call_from_object(obj: Any) -> ToolCall | ToolCallError:
    """A call from a decoded JSON object ``{"name": ..., "arguments": {...}}`` (Llama
    writes ``"parameters"``); anything else is ``malformed_call``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCallError(
            "malformed_call", 'a tool call must be an object {"name": ..., "arguments": {...}}'
        )
    return call_of(obj["name"], obj.get("arguments", obj.get("parameters", {})))


def call_of(name: str, arguments: Any) -> ToolCall | ToolCallError:
    """A call from its name and arguments as written: an object, a JSON text of one
    (arguments encoded twice, or a format that writes them apart from the name), empty
    or None for no arguments; anything else is an error of its kind."""
    if isinstance(arguments, str):  # double-encoded: '{"arguments": "{\"x\": 1}"}'
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            return ToolCallError("malformed_json", f"arguments are not valid JSON ({exc})", name)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallError("invalid_arguments", "arguments must be a JSON object", name)
    return ToolCall(name, arguments)


def format_call(name: str, /, **arguments: Any) -> str:
    """One tool call as the model writes it in the default Hermes format (for a scripted
    ``demonstrate`` policy): ``format_call("grep", pattern="ERROR")`` gives
    ``<tool_call>`` + newline + ``{"name": "grep", "arguments": {"pattern": "ERROR"}}``
    + newline + ``</tool_call>``.
    """
    return HermesParser().format_call(name, arguments)


# --------------------------------------------------------------------------- execution


class ToolOutcome(msgspec.Struct):
    """The message for the model and, when the call failed, the error kind."""

    message: Message
    error: str | None = None


def error_message(kind: str, text: str, name: str | None) -> ToolOutcome:
    """A tool-role error message the model can read and recover from (bounded, valid
    UTF-8 even when it echoes the model's text)."""
    content = valid_utf8(clip(f"Error ({kind}): {text}", MAX_ERROR_CHARS, "the error"))
    return ToolOutcome(Message("tool", content, valid_utf8(clip(name or "error", 64))), kind)


def run_call(tools: dict[str, BoundTool], call: ToolCall | ToolCallError,
             default_timeout_s: float, max_output_chars: int = MAX_OUTPUT_CHARS) -> ToolOutcome:
    """Validate and run one call; every failure becomes an error message, never a raise.
    The result is cut to ``max_output_chars`` characters (with a marker)."""
    if isinstance(call, ToolCallError):
        return error_message(call.kind, call.message, call.name)
    bound = tools.get(call.name)
    if bound is None:
        known = ", ".join(tools) or "none"
        return error_message("unknown_tool",
                             f"no tool named {short_repr(call.name)} (tools: {known})", call.name)
    try:
        kwargs = validate_arguments(bound.spec, bound.fn, call.arguments)
    except ValueError as exc:
        return error_message("invalid_arguments", str(exc), call.name)
    timeout = bound.spec.timeout_s if bound.spec.timeout_s is not None else default_timeout_s
    outcome = _call_with_timeout(bound, kwargs, timeout)
    if outcome.error is None:
        text = valid_utf8(clip(outcome.message.content, max_output_chars, "the tool's output"))
        outcome.message.content = text
    return outcome


def validate_arguments(spec: ToolSpec, fn: Callable, arguments: dict[str, Any]) -> dict:
    """Check names and types against the hints; ints are accepted where floats are asked."""
    hints = typing.get_type_hints(fn)
    props = spec.parameters["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise ValueError(f"unexpected argument(s) {short_repr(unknown)}; {spec.name} takes "
                         f"{list(props)}")
    missing = [p for p in spec.parameters["required"] if p not in arguments]
    if missing:
        raise ValueError(f"missing required argument(s) {missing} for {spec.name}")
    kwargs = {}
    for key, value in arguments.items():
        try:
            kwargs[key] = msgspec.convert(value, hints[key], strict=True)
        except msgspec.ValidationError as exc:
            raise ValueError(f"argument {key!r}: {short_repr(str(exc), 200)}") from None
    return kwargs


def _call_with_timeout(bound: BoundTool, kwargs: dict, timeout_s: float) -> ToolOutcome:
    # A daemon thread, because a Python function cannot be killed: on timeout the model is
    # told so and the thread is abandoned (tools that can hang should enforce their own
    # limits, as the sandbox does with a subprocess).
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = bound.fn(**kwargs)
        except Exception as exc:  # the tool's own failure goes back to the model
            box["error"] = f"{type(exc).__name__}: {brief(exception_message(exc))}"

    # the caller's context goes with it: its sandbox meter and process scope
    # (agentrl.sandbox.scope: an abandoned step stops the sandboxes its tools started)
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(target,), daemon=True,
                              name=f"tool-{bound.spec.name}")
    thread.start()
    thread.join(timeout_s)
    name = bound.spec.name
    if thread.is_alive():
        return error_message("timeout", f"{name} did not finish within {timeout_s:g} s", name)
    if "error" in box:
        return error_message("tool_exception", box["error"], name)
    return ToolOutcome(Message("tool", _to_text(box.get("result")), name))


def _to_text(result: Any) -> str:
    """The tool's result as the observation's text; never raises (an int too long to
    print, or an object whose ``__str__`` fails, is named instead)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        pass
    try:
        return str(result)
    except Exception:  # noqa: BLE001 - e.g. ValueError for an int past 4300 digits
        return short_repr(result)

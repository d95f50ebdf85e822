"""How an OpenEnv server's actions and observations meet the policy's text and messages.

Both directions are read from the server's ``/schema`` once and can be overridden per
environment (the ``OpenEnvEnv`` keyword in brackets).

**Text → action** (:class:`ActionMapping`). The action schema's fields, without the base
``metadata`` field, decide:

1. ``[action_field = "name"]``: the whole text goes into that field: ``{"name": text}``.
2. Else, when the action has one string field that is required (or its only field), the
   text goes into it (the OpenEnv template's ``message``, an agentrl server's ``text``).
3. Else the action is structured: the policy is offered one tool, ``action``, whose
   parameters are the action schema, and writes either that tool call (in the
   environment's tool-call format, Hermes ``<tool_call>`` by default) or the bare JSON
   object. The object is checked against the schema before anything is sent; text that
   holds no valid action is answered with an error message the policy sees (counted in
   ``tool_errors`` as ``malformed_json`` or ``invalid_arguments``, reward 0) and the step
   never reaches the server: what the policy writes cannot invalidate its rollout.
4. ``[action_map = "module:function"]`` replaces all of this: ``function(text, schema)``
   returns the action dict, or raises ``ValueError`` whose message the policy sees.

**Observation → messages** (:func:`observation_messages`). The observation's fields,
without ``done``, ``reward``, ``metadata`` and ``tools``:

1. ``[observation_map = "module:function"]``: ``function(observation, is_reset)`` returns a
   list of ``{"role", "content"}`` dicts (or ``Message``s).
2. A ``messages`` field holding chat messages (``role``, ``content``, optional ``name``) is
   taken as it is (what ``agentrl serve-env`` sends); a ``tools`` field of the reset
   observation (OpenAI function schemas) becomes the environment's tools.
3. ``[observation_field = "name"]``: that field's text (JSON when it is not a string).
4. Else the observation's one string field when it has exactly one (its other fields are
   not shown), otherwise every field as one JSON object.

Each observation of cases 3-4 becomes one ``user`` message; reset observations may be
preceded by the ``system_prompt`` keyword.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from agentrl.envs.tools import ToolCall, ToolCallError, ToolCallParser
from agentrl.types import Message

RESERVED_OBSERVATION_FIELDS = frozenset({"done", "reward", "metadata", "tools"})
ACTION_TOOL = "action"
"""The tool a structured action is offered as (rule 3)."""
ROLES = ("system", "user", "assistant", "tool")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


class InvalidAction(ValueError):
    """The policy's text holds no valid action; ``kind`` is a ``tool_errors`` kind and the
    message is what the policy is told."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BadObservation(ValueError):
    """An observation that cannot become messages (a malformed reply of the server)."""


def action_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The action schema's properties, without OpenEnv's base ``metadata`` field."""
    properties = schema.get("properties") or {}
    return {k: v for k, v in properties.items() if k != "metadata" and isinstance(v, dict)}


class ActionMapping:
    """The policy's text → the server's action (rules in the module docstring)."""

    def __init__(self, schema: dict[str, Any], field: str | None = None,
                 custom: Callable[[str, dict], dict] | None = None,
                 parser: ToolCallParser | None = None) -> None:
        """``schema``: the action's JSON schema from ``/schema``."""
        self.schema = schema
        self.custom = custom
        self.parser = parser
        self.field = field if custom is None else None
        fields = action_fields(schema)
        if field is not None and field not in fields:
            raise ValueError(f"action_field {field!r} is not a field of the server's action; "
                             f"its fields: {', '.join(fields) or '(none)'}")
        if custom is None and field is None:
            self.field = text_field(schema)
            if self.field is None and not fields:
                raise ValueError("the server's action has no fields of its own (an MCP tool "
                                 "environment, whose actions are list_tools / call_tool, is "
                                 "not supported); give action_map to build its actions")

    @property
    def mode(self) -> str:
        """"custom", "field" (the text into one field) or "json" (a structured action)."""
        if self.custom is not None:
            return "custom"
        return "field" if self.field is not None else "json"

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The ``action`` tool a structured action is offered as (empty otherwise)."""
        if self.mode != "json":
            return []
        parameters = {k: v for k, v in self.schema.items() if k not in ("title", "description")}
        parameters["properties"] = action_fields(self.schema)
        required = [r for r in self.schema.get("required", []) if r != "metadata"]
        parameters["required"] = required
        description = self.schema.get("description") or "Take one action in the environment."
        return [{"type": "function", "function": {
            "name": ACTION_TOOL, "description": " ".join(description.split()),
            "parameters": parameters}}]

    def action(self, text: str) -> dict[str, Any]:
        """The action for ``text``; raises :class:`InvalidAction` when it holds none."""
        if self.custom is not None:
            try:
                action = self.custom(text, self.schema)
            except ValueError as exc:
                raise InvalidAction("invalid_arguments", str(exc)) from None
            if not isinstance(action, dict):
                raise TypeError(f"action_map returned {type(action).__name__}; it must return "
                                "the action as a dict")
            return action
        if self.field is not None:
            return {self.field: text}
        action = self._structured(text)
        problem = schema_problem(action, self.schema)
        if problem is not None:
            raise InvalidAction("invalid_arguments",
                                f"the action {problem}")
        return action

    def _structured(self, text: str) -> dict[str, Any]:
        for call in self.parser.parse(text) if self.parser is not None else []:
            if isinstance(call, ToolCallError):
                raise InvalidAction(call.kind, call.message)
            if isinstance(call, ToolCall) and call.name == ACTION_TOOL:
                return dict(call.arguments)
            raise InvalidAction("unknown_tool", f"the only tool is "
                                f"{ACTION_TOOL!r}; {call.name!r} does not exist")
        body = text.strip()
        fenced = _FENCE.match(body)
        try:
            value = json.loads(fenced.group(1) if fenced else body)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise InvalidAction("malformed_json", "reply with one "
                                f"{ACTION_TOOL!r} tool call, or the action as a JSON object "
                                f"with the fields {', '.join(action_fields(self.schema))}")
        return value


def text_field(schema: dict[str, Any]) -> str | None:
    """The string field the whole text goes into (rule 2), or None for a structured action."""
    fields = action_fields(schema)
    strings = [k for k, v in fields.items() if v.get("type") == "string"]
    if len(fields) == 1 and strings:
        return strings[0]
    required = [k for k in schema.get("required", []) if k in fields]
    if len(required) == 1 and required[0] in strings:
        return required[0]
    return None


def schema_problem(action: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``action`` does not satisfy the JSON schema (one short sentence), or None."""
    import jsonschema

    try:
        jsonschema.validate(action, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        return f"{'field ' + where + ': ' if where else ''}{exc.message}"
    return None


def observation_messages(observation: Any, field: str | None = None,
                         custom: Callable[[dict, bool], list] | None = None,
                         is_reset: bool = False) -> list[Message]:
    """The messages an observation dict shows the policy (rules in the module docstring);
    raises :class:`BadObservation` for a reply that cannot be shown."""
    if not isinstance(observation, dict):
        raise BadObservation(f"the observation is {type(observation).__name__}, not a JSON "
                             "object")
    if custom is not None:
        return [as_message(m, i) for i, m in enumerate(custom(observation, is_reset))]
    if observation.get("messages") is not None and field is None:
        listed = observation["messages"]
        if not isinstance(listed, list):
            raise BadObservation("the observation's 'messages' is not a list")
        return [as_message(m, i) for i, m in enumerate(listed)]
    content = {k: v for k, v in observation.items()
               if k not in RESERVED_OBSERVATION_FIELDS and not (k == "messages" and v is None)}
    if field is not None:
        if field not in observation:
            raise BadObservation(f"the observation has no field {field!r} (observation_field); "
                                 f"its fields: {', '.join(content) or '(none)'}")
        value = observation[field]
        return [Message("user", value if isinstance(value, str) else _json(value))]
    if not content:
        return []
    strings = [v for v in content.values() if isinstance(v, str)]
    return [Message("user", strings[0] if len(strings) == 1 else _json(content))]


def observation_tools(observation: Any) -> list[dict[str, Any]]:
    """The tools a reset observation declares (an OpenAI schema list), else []."""
    tools = observation.get("tools") if isinstance(observation, dict) else None
    if isinstance(tools, list) and all(isinstance(t, dict) for t in tools):
        return tools
    return []


def as_message(item: Any, index: int) -> Message:
    """A ``Message`` from a chat-message dict (or a Message); BadObservation otherwise."""
    if isinstance(item, Message):
        return item
    if not (isinstance(item, dict) and item.get("role") in ROLES
            and isinstance(item.get("content"), str)):
        raise BadObservation(f"observation message {index} is not a chat message with a "
                             f"role in {ROLES} and text content: {str(item)[:120]!r}")
    name = item.get("name")
    return Message(item["role"], item["content"], name if isinstance(name, str) else None)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)

"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the reply is ``{"name": ..., "parameters":
{...}}`` (several separated by ``;``), optionally opened by ``<|python_tag|>``.

A reply that does not start with ``{`` (after the tag), or that is JSON naming no
function (``{"answer": 42}``), is a plain answer, as in vLLM's ``llama3_json`` parser; one
that starts with ``{`` but is not JSON is ``malformed_json``.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.envs.parsers.common import calls_from_json, json_values
from agentrl.envs.tools import ToolCall, ToolCallError

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser:
    """Llama 3.x's JSON calls (with or without ``<|python_tag|>``)."""

    name = "llama3_json"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        """The calls of a reply that is JSON from its start; else a plain answer."""
        body = text.strip()
        tagged = body.startswith(PYTHON_TAG)
        if tagged:
            body = body[len(PYTHON_TAG):].lstrip()
        if not body.startswith(("{", "[")):
            if tagged:
                return [ToolCallError("malformed_call",
                                      f"{PYTHON_TAG} is not followed by a JSON call")]
            return []
        values, error = json_values(body)
        if not tagged and error is None and not any(
                isinstance(v, dict) and "name" in v for v in values):
            return []  # a JSON answer, not a call (vLLM's reading too)
        return calls_from_json(body)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """``{"name": NAME, "parameters": {...}}``, as Llama's template renders a call."""
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

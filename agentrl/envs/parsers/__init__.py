"""Tool-call parsers, one per model family's format, and which one a checkpoint uses.

- ``hermes``: Qwen2.5, Qwen3, Hermes, the tiny checkpoints:
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
- ``qwen3_coder``: Qwen3-Coder: ``<tool_call><function=NAME><parameter=K>V</parameter>...``;
- ``llama3_json``: Llama 3.1 / 3.2 / 3.3: ``{"name": ..., "parameters": ...}``, optionally
  after ``<|python_tag|>``;
- ``mistral``: Mistral, Mistral-Small, Magistral: ``[TOOL_CALLS][{...}]`` or
  ``[TOOL_CALLS]NAME[ARGS]{...}``;
- ``harmony``: gpt-oss: ``<|channel|>commentary to=functions.NAME ...<|message|>{...}<|call|>``;
- ``deepseek_v3``: DeepSeek-V3 / R1 / V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...``.

``model.tool_format`` picks one by name; ``"auto"`` (the default) reads the checkpoint's
chat template (:func:`detect_tool_format`) and the run prints the choice and why. Every
``AgentEnv`` built without an explicit ``parser=`` adopts it (:func:`adopt_tool_format`),
so its ``parse`` and ``format_call`` speak the model's format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.envs.parsers.deepseek import CALLS_BEGIN, DeepSeekV3Parser
from agentrl.envs.parsers.harmony import HarmonyParser
from agentrl.envs.parsers.llama3 import Llama3JsonParser
from agentrl.envs.parsers.mistral import TOOL_CALLS, MistralParser
from agentrl.envs.parsers.qwen3_coder import Qwen3CoderParser
from agentrl.envs.tools import HermesParser, ToolCallParser

PARSERS: dict[str, Callable[..., ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "harmony": HarmonyParser,
    "deepseek_v3": DeepSeekV3Parser,
}
"""Parsers by name (``model.tool_format``, ``AgentEnv(parser=...)``)."""

TOOL_FORMATS = ("auto", *PARSERS)
"""The values of ``model.tool_format``."""

_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>", "<|call|>")),
    ("deepseek_v3", (CALLS_BEGIN,)),
    ("mistral", (TOOL_CALLS,)),
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("hermes", ("<tool_call>",)),
    ("llama3_json", ("<|start_header_id|>", '"parameters"')),
    ("llama3_json", ("<|python_tag|>",)),
)
"""What each format's template writes, most specific first (Qwen3-Coder's also holds
``<tool_call>``)."""


def make_parser(name: str, schemas: dict[str, dict[str, Any]] | None = None
                ) -> ToolCallParser:
    """The parser of a format by name; ``schemas`` (parameters by tool name) types the
    values of formats that write them as text (``qwen3_coder``)."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call format {name!r}; choose one of {sorted(PARSERS)}")
    if name == "qwen3_coder":
        return Qwen3CoderParser(schemas)
    return PARSERS[name]()


def detect_tool_format(template: str | None) -> tuple[str, str]:
    """The format a chat template teaches its model, and why: the first format whose
    markers the template holds; ``hermes`` (said so) when none does."""
    for name, signs in _SIGNS:
        if template and all(sign in template for sign in signs):
            return name, "the chat template writes " + " and ".join(signs)
    return "hermes", "no known tool-call markup in the chat template: the default"


def resolve_tool_format(setting: str, tokenizer: Any) -> tuple[str, str]:
    """``model.tool_format`` made concrete for this tokenizer: (format, why)."""
    if setting != "auto":
        make_parser(setting)  # a known name, or an error naming the choices
        return setting, "model.tool_format"
    return detect_tool_format(getattr(tokenizer, "chat_template", None))


def adopt_tool_format(env: Any, name: str) -> Any:
    """Give an environment built without an explicit parser the model's format (an
    ``AgentEnv`` records ``parser_from_model``); other environments are left as they
    are. Returns the environment."""
    if getattr(env, "parser_from_model", False):
        tools = getattr(env, "tools", {}) or {}
        env.parser = make_parser(name, {n: t.spec.parameters for n, t in tools.items()})
    return env

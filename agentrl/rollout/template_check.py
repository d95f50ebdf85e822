"""What a checkpoint's chat template does to multi-turn training, found at load time.

:func:`prepare_chat` picks the model's tool-call format (``model.tool_format``), then
plays a scripted tool conversation through the template the way the runner does
(:class:`~agentrl.rollout.context.ChatContext`): tool calls in that format, ``<think>``
reasoning before a call, a new user message after it, a reply with a trailing space.
Each scripted turn either appends to what came before, or the template re-renders
(``TEMPLATE_REWRITES``: it trims the reply, drops reasoning, rewrites earlier turns),
and in a rollout such a turn starts a new row (cause ``template``). A template that refuses
tool messages given as text (gpt-oss, Mistral) is fed calls as ``tool_calls``. The run
prints the finding (:meth:`TemplateFinding.describe`) and sets the style on the tokenizer.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentrl.config import ModelConfig
from agentrl.envs.parsers import make_parser, resolve_tool_format
from agentrl.rollout.chat_style import ChatStyle, stop_ids_of
from agentrl.rollout.context import ChatContext, TemplateRenderError, TemplateRewrite

_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a fact up.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}]
_HEAD = [{"role": "system", "content": "You answer with the lookup tool."},
         {"role": "user", "content": "What is 2 + 2?"}]


class TemplateFinding(msgspec.Struct):
    """How the template renders a scripted tool conversation."""

    style: ChatStyle
    format_reason: str
    """Why this tool-call format (the setting, or what the template writes)."""
    rewrites: list[tuple[str, str]] = []
    """(scripted turn, ``TEMPLATE_REWRITES`` reason) for each turn the template
    re-rendered instead of appending to."""
    error: str | None = None
    """The template refused the conversation either way (rollouts will be invalid with
    ``chat_template_raised``)."""

    @property
    def appends(self) -> bool:
        """Every scripted turn appended: one row per rollout unless compacted."""
        return not self.rewrites and self.error is None

    def describe(self) -> str:
        """The lines the run prints at start-up."""
        style = self.style
        calls = "as tool_calls" if style.structured else "as the reply's text"
        lines = [f"tool calls: {style.tool_format} ({self.format_reason}); the template "
                 f"is given them {calls}"]
        if self.error is not None:
            lines.append(f"chat template: cannot render a tool conversation ({self.error}); "
                         "rollouts will be invalid (chat_template_raised)")
        elif self.appends:
            lines.append("chat template: appends every turn (one row per rollout unless "
                         "compacted)")
        else:
            found = "; ".join(f"{turn}: {reason}" for turn, reason in self.rewrites)
            lines.append(f"chat template: re-renders earlier turns ({found}); each such turn "
                         "starts a new row of its rollout (compaction cause template)")
        return "\n".join(lines)


def scripted_turns(tool_format: str) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(label, reply, observation) of the scripted conversation, calls in the format."""
    parser = make_parser(tool_format)
    call = parser.format_call("lookup", {"query": "2 + 2"})
    return [
        ("a tool call", call, [{"role": "tool", "name": "lookup", "content": "4"}]),
        ("reasoning before a tool call", "<think>\nThe tool said 4.\n</think>\n\n"
         + parser.format_call("lookup", {"query": "check"}),
         [{"role": "tool", "name": "lookup", "content": "4"}]),
        ("a new user message after reasoning", "The answer is 4.",
         [{"role": "user", "content": "And 3 + 3?"}]),
        ("a reply with a trailing space", "6 ", [{"role": "user", "content": "Thanks."}]),
    ]


def check_template(tokenizer: Any, style: ChatStyle, reason: str = "") -> TemplateFinding:
    """Play the scripted conversation through ``tokenizer``'s template in ``style``."""
    saved = getattr(tokenizer, "chat_style", None)
    tokenizer.chat_style = style
    finding = TemplateFinding(style, reason)
    try:
        context = ChatContext(tokenizer, _TOOLS, _HEAD)
        context.prompt_ids()
        stop_ids = stop_ids_of(tokenizer)
        for label, reply, observation in scripted_turns(style.tool_format):
            generated = [*tokenizer.encode(reply), tokenizer.eos_token_id]
            try:
                turn, _ = context.turn_delta(generated, stop_ids, observation)
            except TemplateRewrite as rewrite:
                finding.rewrites.append((label, rewrite.reason))
                turn = rewrite.turn
            context.turns.append(turn)
    except TemplateRenderError as exc:
        finding.error = str(exc)
    finally:
        tokenizer.chat_style = saved
    return finding


def prepare_chat(tokenizer: Any, model: ModelConfig | None = None) -> TemplateFinding:
    """Choose the model's tool-call format (``model.tool_format``) and how its template
    takes calls (text, or ``tool_calls`` where text is refused), set that style (with
    ``model.chat_template_kwargs``) on the tokenizer, and return what the template does
    to a tool conversation."""
    model = model or ModelConfig()
    name, reason = resolve_tool_format(model.tool_format, tokenizer)
    extra = dict(model.chat_template_kwargs)
    finding = check_template(tokenizer, ChatStyle(name, False, extra), reason)
    if finding.error is not None:
        structured = check_template(tokenizer, ChatStyle(name, True, extra), reason)
        if structured.error is None:
            finding = structured
    tokenizer.chat_style = finding.style
    return finding

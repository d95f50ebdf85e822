"""Growing a multi-turn context by appending token ids, never re-encoding earlier text.

The conversation starts as the environment's reset messages rendered by the chat
template (with the tools and the generation prompt) and encoded once. After that the
context only grows at its end:

- the model's generated ids are appended exactly as the engine returned them;
- each observation is the *delta* the template adds for the new messages: the text of
  ``render(history + [assistant] + observation, generation prompt)`` past
  ``render(history, generation prompt)`` and the reply's text: whatever closing text the
  template puts after the reply (``<|im_end|>\\n`` for ChatML) minus the part the model
  already emitted (its stop token), so an ``<|im_end|>`` is never added twice, then the
  observation's messages and the next generation prompt.

A template that renders the history otherwise (it trims the reply, drops reasoning,
re-formats earlier turns) raises :class:`TemplateRewrite`; the runner starts a new row
there (docs/models.md).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from agentrl.observe.profile import section
from agentrl.rollout.chat_style import num_calls, structured_turn, style_of
from agentrl.types import as_dicts


class Turn(msgspec.Struct):
    """One model turn as messages: the assistant's reply and the observation that followed."""

    assistant: dict[str, Any]
    observation: list[dict[str, Any]] = []


class TemplateRenderError(Exception):
    """The chat template refused the conversation (its ``raise_exception``, or a field
    it needs): the rollout becomes invalid (``chat_template_raised``), never the run."""


class TemplateRewrite(ValueError):
    """The chat template renders this turn's history otherwise than the engine saw it
    (it trims the reply, drops earlier reasoning, re-formats earlier turns), so the
    observation cannot be appended as a token delta: the runner starts a new row of the
    same rollout from the template's own rendering (a compaction with cause
    ``template``, its ``reason`` one of ``TEMPLATE_REWRITES``)."""

    def __init__(self, turn: Turn, reason: str) -> None:
        super().__init__(
            f"the chat template re-renders the conversation ({reason}) instead of appending "
            f"to it, so the turn {turn.assistant['content'][:40]!r} starts a new row")
        self.turn = turn
        self.reason = reason


def rewrite_reason(prompt_text: str, full_text: str, content: str) -> str:
    """Why the template's rendering of the next prompt (``full_text``) does not extend
    the last prompt plus the reply: ``trimmed`` (the reply's outer whitespace went),
    ``reasoning_dropped`` (a ``<think>`` block went) or ``rewritten`` (anything else,
    earlier turns included)."""
    if full_text.startswith(prompt_text):
        rendered = full_text[len(prompt_text):]
        if content != content.strip() and rendered.lstrip().startswith(content.strip()):
            return "trimmed"
        if "</think>" in content and content.split("</think>")[-1].strip() in rendered:
            return "reasoning_dropped"
    elif _without_reasoning(full_text).startswith(_without_reasoning(prompt_text)):
        return "reasoning_dropped"
    return "rewritten"


def _without_reasoning(text: str) -> str:
    """The text without its ``<think>...</think>`` blocks (empty ones included)."""
    return re.sub(r"<think>.*?</think>\s*", "", text, flags=re.S)


class ChatContext:
    """The messages of one conversation and how to render additions as token-id deltas."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None, head: list[Any]) -> None:
        """``head``: the messages the conversation starts from (system + task)."""
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.head = as_dicts(head)
        self.turns: list[Turn] = []
        self.style = style_of(tokenizer)
        """The model's tool-call format and how its template takes calls."""

    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation as message dicts."""
        out = list(self.head)
        for turn in self.turns:
            out.append(turn.assistant)
            out.extend(turn.observation)
        return out

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        """The chat template's text for ``messages``."""
        with section("rollout/chat_template"):
            try:
                return self.tokenizer.apply_chat_template(
                    messages, tools=self.tools, add_generation_prompt=generation_prompt,
                    **self.style.template_kwargs)
            except Exception as exc:  # noqa: BLE001 - raise_exception, a missing field, ...
                raise TemplateRenderError(
                    f"the chat template cannot render this conversation: "
                    f"{type(exc).__name__}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added around it)."""
        with section("rollout/tokenizer"):
            return list(self.tokenizer.encode(text))

    def prompt_ids(self) -> list[int]:
        """Encode the whole conversation with the generation prompt (a fresh context)."""
        return self.encode(self.render(self.messages(), generation_prompt=True))

    def assistant_text(self, generated_ids: list[int], stop_ids: tuple[int, ...]) -> str:
        """The reply's content: the generated text without a trailing stop token."""
        ids = generated_ids[:-1] if generated_ids and generated_ids[-1] in stop_ids else (
            generated_ids
        )
        with section("rollout/tokenizer"):
            return self.tokenizer.decode(ids)

    def turn_delta(
        self, generated_ids: list[int], stop_ids: tuple[int, ...], observation: list[Any]
    ) -> tuple[Turn, list[int]]:
        """The turn as messages and the ids its observation adds; the caller records the
        turn (``turns.append``) or hands it to a compactor. Raises
        :class:`TemplateRewrite` (carrying the turn) when the template does not append."""
        before = self.messages()
        content = self.assistant_text(generated_ids, stop_ids)
        turn = Turn(*structured_turn(self.style, content, as_dicts(observation),
                                     num_calls(before)))
        prompt_text = self.render(before, generation_prompt=True)
        full_text = self.render(
            [*before, turn.assistant, *turn.observation], generation_prompt=True
        )
        if not full_text.startswith(prompt_text + content):
            raise TemplateRewrite(turn, rewrite_reason(prompt_text, full_text, content))
        delta_ids = self.encode(full_text[len(prompt_text) + len(content):])
        if generated_ids and generated_ids[-1] in stop_ids and delta_ids[:1] == [
            generated_ids[-1]
        ]:
            delta_ids = delta_ids[1:]  # the model already emitted the end-of-turn token
        return turn, delta_ids

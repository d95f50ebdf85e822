"""The context budget in the open: how many tokens each environment's first prompt takes.

The first prompt is what the engine receives before the model's first turn: the chat
template's rendering of the environment's reset messages with its tool schemas. It is
split into the system prompt, the tool schemas and the first observation (the task):
each part is the difference between two renderings, so the parts add up to the total
exactly. With compaction on, the prompt must fit ``compaction.max_context_tokens`` with
room for turns, because compaction keeps the system, the task and the newest turn; a
first prompt over the budget is refused by ``agentrl plan``, ``agentrl check-env`` and
``agentrl train`` (one line naming the environment, the numbers and the knob).
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentrl.config import Config, ConfigError
from agentrl.types import as_dicts

NUM_TASKS = 8
"""Train tasks (seeds 0..7) measured per environment; the longest first prompt counts."""


class PromptBudget(msgspec.Struct, frozen=True):
    """Tokens of one environment's first prompt, by part (the longest of NUM_TASKS tasks)."""

    env: str
    system_tokens: int
    """The system message(s), rendered by the chat template."""
    tool_tokens: int
    """What the tool schemas add to the rendering."""
    observation_tokens: int
    """The rest: the task message(s) and the generation prompt."""

    @property
    def total(self) -> int:
        """Tokens of the whole first prompt."""
        return self.system_tokens + self.tool_tokens + self.observation_tokens


def measure_first_prompt(env: Any, tokenizer: Any, name: str, num_tasks: int = NUM_TASKS,
                         extra_tools: list[dict[str, Any]] | None = None) -> PromptBudget:
    """The first prompt's tokens by part, for the longest of ``num_tasks`` train tasks;
    ``extra_tools``: schemas the runner offers beside the environment's (``compact``)."""
    heads = [env.reset(seed=seed)[0] for seed in range(num_tasks)]
    tools = [*env.tool_schemas(), *(extra_tools or [])]
    return budget_of_prompts(heads, tools or None, tokenizer, name)


def budget_of_prompts(heads: list[Any], tools: list[dict[str, Any]] | None, tokenizer: Any,
                      name: str) -> PromptBudget:
    """The longest of these first prompts (each the task's reset messages) by part."""

    def count(messages: list[dict[str, Any]], with_tools: bool, prompt: bool) -> int:
        if not messages:
            return 0
        text = tokenizer.apply_chat_template(messages, tools=tools if with_tools else None,
                                             add_generation_prompt=prompt)
        return len(tokenizer.encode(text))

    longest: PromptBudget | None = None
    for messages in heads:
        head = as_dicts(messages)
        num_system = next((i for i, m in enumerate(head) if m["role"] != "system"), len(head))
        total = count(head, with_tools=True, prompt=True)
        without_tools = count(head, with_tools=False, prompt=True)
        system = count(head[:num_system], with_tools=False, prompt=False)
        budget = PromptBudget(name, system, total - without_tools, without_tools - system)
        if longest is None or budget.total > longest.total:
            longest = budget
    assert longest is not None
    return longest


def subagent_prompt_tokens(env: Any, tokenizer: Any,
                           extra_tools: list[dict[str, Any]] | None = None) -> dict[str, int]:
    """Tokens each ``@subagent`` thread of the environment starts from before its task
    text: its system prompt and its tools' schemas (plus ``extra_tools``, those the
    rollout adds to every thread, e.g. ``compact``) through the chat template (the task is
    built from each call's arguments, so it is not known before a call)."""
    from agentrl.envs.subagents import BoundSubagent

    out: dict[str, int] = {}
    for name, bound in (getattr(env, "subagents", None) or {}).items():
        assert isinstance(bound, BoundSubagent)
        tools = [t.spec.schema() for t in env.named_tools(bound.spec.tools).values()]
        tools += extra_tools or []
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": bound.spec.system}, {"role": "user", "content": ""}],
            tools=tools or None, add_generation_prompt=True)
        out[name] = len(tokenizer.encode(text))
    return out


TINY_TOKENIZER_NOTE = (
    "measured with the tiny built-in tokenizer, which `agentrl train` uses when model.path "
    "is empty; a model from `agentrl sft --out DIR` has a tokenizer fitted to your "
    "environments' text (prompts about half as long): measure with --set model.path=DIR")


def budget_problem(budget: PromptBudget, config: Config) -> str | None:
    """Why this first prompt cannot run under the config (one line), or None when it fits."""
    compaction, rollout = config.compaction, config.rollout
    if compaction.strategy == "none" or budget.total <= compaction.max_context_tokens:
        return None
    return (
        f"environment {budget.env!r}: its first prompt is {budget.total} tokens (system "
        f"{budget.system_tokens} + tool schemas {budget.tool_tokens} + first observation "
        f"{budget.observation_tokens}), over compaction.max_context_tokens = "
        f"{compaction.max_context_tokens}, so no turn fits the context; raise "
        f"compaction.max_context_tokens to at least {budget.total + rollout.max_new_tokens} "
        f"(the prompt plus one turn of rollout.max_new_tokens = {rollout.max_new_tokens}) "
        "and room for tool results, or shorten the system prompt, tool docstrings or task"
        + ("" if config.model.path else f" ({TINY_TOKENIZER_NOTE})")
    )


def describe_budgets(budgets: list[PromptBudget], config: Config, tokenizer_name: str) -> str:
    """The per-environment lines ``agentrl plan`` and ``agentrl check-env`` print."""
    compaction, rollout = config.compaction, config.rollout
    lines = [f"context budget (first prompt = chat template over the reset messages and tool "
             f"schemas, tokenizer: {tokenizer_name}; longest of {NUM_TASKS} tasks):"]
    width = max(len(b.env) for b in budgets)
    for b in budgets:
        line = (f"  {b.env:<{width}}  system {b.system_tokens} + tools {b.tool_tokens} + first "
                f"observation {b.observation_tokens} = {b.total} tokens")
        room = compaction.max_context_tokens - b.total
        line += f" of compaction.max_context_tokens {compaction.max_context_tokens}: "
        if compaction.strategy == "none":
            line = line.split(" of ")[0] + " (compaction off: no context budget)"
        elif room < 0:
            line += f"OVER by {-room}: refused"
        elif room < rollout.max_new_tokens:
            line += (f"{room} left for turns, less than one turn of rollout.max_new_tokens "
                     f"{rollout.max_new_tokens}: long turns end rollouts "
                     "(truncated/context_budget)")
        else:
            line += f"{room} left for turns"
        lines.append(line)
    lines.append(f"  generation: rollout.max_new_tokens {rollout.max_new_tokens} per turn, "
                 f"rollout.max_turns {rollout.max_turns}, rollout.max_rollout_tokens "
                 f"{rollout.max_rollout_tokens} per rollout")
    if not config.model.path:
        lines.append(f"  note: {TINY_TOKENIZER_NOTE}")
    return "\n".join(lines)


def refuse_over_budget(budgets: list[PromptBudget], config: Config) -> None:
    """Raise ConfigError for the first environment whose first prompt does not fit."""
    for budget in budgets:
        problem = budget_problem(budget, config)
        if problem is not None:
            raise ConfigError(problem)

"""Plan-time checks of sizes (:mod:`agentrl.train.preflight`): the longest row against the
model's positions and the micro-batch budget, each first prompt against the context budget,
the compaction tool's name, and the tokens of rollout trees."""

from __future__ import annotations

from typing import Any

from agentrl.config import ConfigError
from agentrl.train.preflight_facts import Preflight


def check_positions(pf: Preflight) -> str:
    """A turn's new tokens and the longest row fit the model's positions."""
    positions = pf.model.max_position_embeddings
    source = f"max_position_embeddings of {pf.model.folder or 'the tiny built-in model'}"
    new_tokens = pf.config.rollout.max_new_tokens
    if new_tokens >= positions:
        raise ConfigError(
            f"rollout.max_new_tokens = {new_tokens} does not fit the model's {positions} "
            f"positions ({source}) with even one prompt token; lower rollout.max_new_tokens "
            f"below {positions}")
    row = pf.longest_row
    if row.tokens > positions + (1 if row.engine_capped else 0):
        raise ConfigError(
            f"the longest row passes the model's {positions} positions ({source}): "
            f"{row.how}; lower {row.knob} by {row.tokens - positions}")
    return f"positions: longest row {row.tokens} of the model's {positions} ({row.how})"


def check_micro_batch_budget(pf: Preflight) -> str:
    """The micro-batch token budget holds the longest row (rows are never split)."""
    budget = pf.config.batch.max_tokens_per_microbatch
    row = pf.longest_row
    if budget < row.tokens:
        raise ConfigError(
            f"batch.max_tokens_per_microbatch = {budget} is smaller than the longest possible "
            f"row ({row.how}); raise batch.max_tokens_per_microbatch to at least "
            f"{row.tokens}, or lower {row.knob}")
    return f"micro-batch: budget {budget} tokens holds the longest row ({row.tokens})"


def check_context_budget(pf: Preflight) -> str:
    """Each environment's first prompt fits ``compaction.max_context_tokens`` (printed by
    part: system, tool schemas, first observation)."""
    from agentrl.envs.context_budget import describe_budgets, refuse_over_budget

    budgets = [pf.prompt_budget(i) for i in range(len(pf.config.environments))]
    table = describe_budgets(budgets, pf.config, pf.tokenizer_name)
    try:
        refuse_over_budget(budgets, pf.config)
    except ConfigError:
        print(table)  # the numbers of every environment, next to the one-line refusal
        raise
    return table


def check_compact_tool(pf: Preflight) -> str:
    """Under ``compaction.strategy = "tool"``, no environment has a tool of its own named
    ``compact`` (the name the policy's compaction tool takes), in its main thread's tools
    or among those its subagents are given (``AgentEnv.tools``)."""
    from agentrl.rollout.compact_tool import COMPACT_TOOL

    compaction = pf.config.compaction
    if compaction.strategy != "tool":
        return f"compaction: {compaction.strategy}"

    def has_compact(built: Any) -> bool:
        return COMPACT_TOOL in (getattr(built, "tools", None) or {}) or any(
            (s.get("function") or {}).get("name") == COMPACT_TOOL for s in built.tool_schemas())

    clashes = [env.display_name() for i, env in enumerate(pf.config.environments)
               if has_compact(pf.environment(i))]
    if clashes:
        raise ConfigError(f'compaction.strategy = "tool" offers the policy a tool named '
                          f'"{COMPACT_TOOL}", and environment(s) {", ".join(clashes)} have '
                          "one of their own; rename theirs or choose another strategy")
    return (f'compaction: the policy compacts with its "{COMPACT_TOOL}" tool; the budget '
            f"({compaction.max_context_tokens} tokens) forces {compaction.fallback}")


def check_threads(pf: Preflight) -> str:
    """Rollout trees: which environments declare subagents, the limits, the tokens a
    rollout can generate across its threads; each subagent's prompt before its task fits
    ``compaction.max_context_tokens``."""
    rollout, compaction = pf.config.rollout, pf.config.compaction
    declared = {env.display_name(): pf.subagent_prompts(i)
                for i, env in enumerate(pf.config.environments)}
    declared = {name: heads for name, heads in declared.items() if heads}
    if not declared:
        return "threads: one per rollout (no environment declares a @subagent)"
    if compaction.strategy != "none":
        for env, heads in declared.items():
            for agent, head in heads.items():
                if head >= compaction.max_context_tokens:
                    raise ConfigError(
                        f"environment {env!r}: subagent {agent} starts from {head} tokens "
                        "(system prompt and tool schemas) before its task, not under "
                        f"compaction.max_context_tokens = {compaction.max_context_tokens}; "
                        "raise compaction.max_context_tokens or shorten its system prompt "
                        "and tools")
    total = rollout.max_rollout_tokens + (rollout.max_subagents_per_rollout
                                          * rollout.max_subagent_tokens)
    where = "; ".join(f"{env}: " + ", ".join(f"{agent} ({head} tokens before its task)"
                                             for agent, head in heads.items())
                      for env, heads in declared.items())
    return (f"threads: subagents in {where}; a rollout starts at most "
            f"rollout.max_subagents_per_rollout = {rollout.max_subagents_per_rollout} of them, "
            f"nested at most rollout.max_subagent_depth = {rollout.max_subagent_depth} deep, "
            f"and generates at most rollout.max_rollout_tokens {rollout.max_rollout_tokens} "
            f"+ {rollout.max_subagents_per_rollout} x rollout.max_subagent_tokens "
            f"{rollout.max_subagent_tokens} = {total} tokens across its threads; the longest "
            f"thread's row: {pf.longest_row.tokens} tokens")

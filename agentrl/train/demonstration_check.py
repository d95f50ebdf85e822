"""Scripted episodes played as ``agentrl sft`` plays them, before any training.

``agentrl check-env --config FILE`` plays the environment's ``demonstrate()`` policy
through the rollout runner under the config's compaction strategy, context budget and
limits, with the tokenizer the warm start will have (:func:`check_tokenizer`), by the
very code ``agentrl sft`` uses (:func:`agentrl.train.sft.demonstrations_under`). An
episode the config cuts short (a thread that cannot fit its context, out of turns or
tokens, out of compactions) or that fails is reported in one line naming the
environment, the numbers and the knob; a turn whose task and newest tool result alone
pass the budget is reported with its token counts.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from agentrl.config import Config, ConfigError
from agentrl.envs.demonstrations import Policy, demonstration_policies
from agentrl.rollout.compact_tool import offered_tools
from agentrl.train.sft import (
    WarmStartConfig,
    curriculum_policies,
    demonstrations_under,
    new_model,
)
from agentrl.types import MAIN_THREAD, Rollout, as_dicts

FIXES = {
    "max_turns": "raise rollout.max_turns (now {rollout.max_turns})",
    "max_rollout_tokens": "raise rollout.max_rollout_tokens (now {rollout.max_rollout_tokens})",
    "max_compactions": "raise compaction.max_compactions (now {compaction.max_compactions})",
    "context_budget": "raise compaction.max_context_tokens (now "
                      "{compaction.max_context_tokens}) or make the tool results shorter",
    "env": "the environment ended it (its own max_turns): raise that",
}
"""The knob to turn for each truncation reason of a scripted episode."""


def config_for_check(path: str | None, overrides: list[str], env_id: str,
                     kwargs: dict) -> Config:
    """The config check-env plays under: ``path`` (or the defaults) with the ``--set``
    overrides applied and one environment: the config's own entry for this id when it
    lists one (its name, its kwargs with ``--kwargs`` laid over them: ``{"num_pages":
    48}`` checks a longer read of the same environment), else ``env_id`` with
    ``kwargs``."""
    from agentrl.config import EnvironmentConfig, config_from_dict, load_config
    from agentrl.config.load import apply_override

    if path:
        config = load_config(path, overrides)
    else:
        raw: dict[str, Any] = {"environments": [{"id": env_id, "kwargs": kwargs}]}
        for override in overrides:
            apply_override(raw, override)
        config = config_from_dict(raw, source="check-env --set")
    listed = [e for e in config.environments if _same_id(e.id, env_id)]
    env_config = (msgspec.structs.replace(listed[0], kwargs={**listed[0].kwargs, **kwargs})
                  if listed else EnvironmentConfig(id=env_id, kwargs=kwargs))
    return msgspec.structs.replace(config, environments=[env_config])


def _same_id(listed: str, given: str) -> bool:
    """The same environment: equal ids, or "file.py:Class" naming the same file (a config
    resolves a file beside it to its own folder)."""
    if listed == given:
        return True
    (a_file, _, a_cls), (b_file, _, b_cls) = listed.rpartition(":"), given.rpartition(":")
    return (a_cls == b_cls and a_file.endswith(".py") and b_file.endswith(".py")
            and Path(a_file).name == Path(b_file).name)


def check_tokenizer(config: Config, base: str | None) -> tuple[Any, str, str | None]:
    """The tokenizer the warm start and the run will see, where it comes from, and why it
    is only a stand-in (None when it is the real one). ``base`` as ``agentrl sft --base``
    (a folder, "base" or "new") when given; else ``model.path``'s when it exists; else
    (a ``model.path`` that ``agentrl sft`` has not written yet) the one ``agentrl sft``
    would start from (the generic base; a new tiny model when the base is missing);
    else (no ``model.path``) the tiny built-in model's, as ``agentrl train``. When a new
    model's tokenizer cannot be fitted (its demonstrations fail: the checks that follow
    say why), the tiny built-in one stands in, with the reason."""
    from agentrl.curriculum.fitted_base import CURRICULUM, curriculum_config
    from agentrl.model import load_tokenizer
    from agentrl.model.base import GENERIC_BASE
    from agentrl.train.preflight_facts import Preflight, locate_model_dir

    path = config.model.path
    if base is None and (not path or _exists(path, locate_model_dir)):
        preflight = Preflight(config)
        return preflight.tokenizer, preflight.tokenizer_name, None
    start = base or "base"
    if start == "base" and (GENERIC_BASE / "config.json").is_file():
        start = str(GENERIC_BASE)
    if start not in ("base", "new", CURRICULUM):
        return load_tokenizer(Path(start)), start, None
    missing = " (the generic base is missing)" if start == "base" else ""
    tiny = msgspec.structs.replace(config, model=msgspec.structs.replace(config.model, path=""))
    try:
        policies = demonstration_policies(config)
    except ConfigError:  # no demonstrations: nothing to fit a tokenizer to
        return Preflight(tiny).tokenizer, "the tiny built-in model's", None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fitted = curriculum_config(config) if start == CURRICULUM else config
            folder = new_model(fitted, WarmStartConfig(), Path(tmp),
                               policies if fitted is config else
                               curriculum_policies(config, fitted, policies))
            tokenizer = load_tokenizer(folder)
    except ConfigError as exc:  # its demonstrations fail
        why = f"`agentrl sft` cannot fit its tokenizer: {str(exc).splitlines()[0]}"
        return Preflight(tiny).tokenizer, "the tiny built-in model's, standing in", why
    flag = "new" if start == "base" else start
    return tokenizer, f"a new tiny model's, as `agentrl sft --base {flag}` fits it{missing}", None


def _exists(path: str, locate: Any) -> bool:
    try:
        locate(path)
    except ConfigError:
        return False
    return True


def play_as_sft(config: Config, tokenizer: Any, ws: WarmStartConfig
                ) -> tuple[str, list[str]]:
    """Play ``ws.num_demonstrations`` scripted episodes of the config's (one) environment
    as ``agentrl sft`` does; a summary line and the problems, one line each."""
    name = config.environments[0].display_name()
    played: list[Rollout] = []
    recorded: dict[int, Any] = {}
    policies = {n: _recording(p, recorded) for n, p in demonstration_policies(config).items()}
    try:
        demonstrations_under(config, ws, tokenizer, policies, lambda _: None, played)
    except ConfigError:  # none was correct: the rollouts below say why
        pass
    counts = Counter(_outcome(r) for r in played)
    strategies = ", ".join(ws.strategies) or config.compaction.strategy
    summary = (f"scripted episodes as `agentrl sft` plays them (compaction.strategy "
               f"{strategies}, compaction.max_context_tokens "
               f"{config.compaction.max_context_tokens}): {len(played)} played, "
               f"{counts['correct']} correct, {counts['graded']} graded wrong (left out: a "
               f"weak demonstrator's wrong answers){_compaction_figures(played)}"
               f"{_fallback_note(played, config)}")
    problems = _failures(played, config, name)
    if counts["truncated/context_budget"]:
        problems += _unfit_turn(list(recorded.values()), config, tokenizer, name)
    return summary, problems


def _compaction_figures(played: list[Rollout]) -> str:
    """Compactions per episode by what made them, and the share of the needed facts seen
    before a compaction that it kept: whether the scripted summaries carry the facts."""
    if not played:
        return ""
    causes = Counter(c.strategy for r in played for c in r.stats.compactions)
    per_episode = ", ".join(f"{n / len(played):.2f} {s}" for s, n in sorted(causes.items()))
    revealed = sum(len(c.facts_revealed) for r in played for c in r.stats.compactions)
    kept = sum(len(c.facts_kept) for r in played for c in r.stats.compactions)
    survival = f"; needed facts kept {kept} of {revealed}" if revealed else ""
    return f"; compactions per episode: {per_episode or 'none'}{survival}"


def _fallback_note(played: list[Rollout], config: Config) -> str:
    """Under ``tool``, a note when the budget's fallback runs less than twice an episode:
    a longer read then meets contexts (many turns dropped, more after them) that training
    never showed, and Voyage's policies broke past their training length that way. A
    ``truncate`` fallback ends the read instead, so it gets none."""
    fallback = config.compaction.fallback
    if config.compaction.strategy != "tool" or fallback == "truncate" or not played:
        return ""
    runs = sum(c.strategy == fallback for r in played for c in r.stats.compactions)
    if runs >= 2 * len(played):
        return ""
    return (f"\nnote: a full context falls back ({fallback}) {runs / len(played):.2f} times per "
            f"episode at this length; a policy meant to hold on longer reads should train "
            f"where it falls back several times (a smaller compaction.max_context_tokens, now "
            f"{config.compaction.max_context_tokens}; docs/writing-environments.md)")


def _recording(policy: Policy, recorded: dict[int, Any]) -> Policy:
    """The policy, remembering every environment instance it plays (their histories)."""

    def play(env: Any, thread_id: str = MAIN_THREAD) -> str | None:
        recorded[id(env)] = env
        return policy(env, thread_id)

    return play


def _outcome(rollout: Rollout) -> str:
    if not rollout.valid:
        return "failed"
    if rollout.stats.truncated:
        return f"truncated/{rollout.stats.truncation_reason}"
    return "correct" if rollout.reward > 0 else "graded"


def _failures(played: list[Rollout], config: Config, name: str) -> list[str]:
    """One line per way the scripted episodes failed or were cut short."""
    lines = []
    failed = [r for r in played if not r.valid]
    if failed:
        lines.append(f"env {name!r}: {len(failed)} of {len(played)} scripted episodes failed, "
                     f"the first because {failed[0].stats.error}")
    by_reason: dict[str, list[Rollout]] = {}
    for rollout in played:
        if rollout.valid and rollout.stats.truncated:
            by_reason.setdefault(rollout.stats.truncation_reason or "env", []).append(rollout)
    for reason, cut in by_reason.items():
        fix = FIXES.get(reason, "see docs/writing-environments.md").format(
            rollout=config.rollout, compaction=config.compaction)
        longest = max(len(s.token_ids) for r in cut for s in r.segments)
        lines.append(f"env {name!r}: {len(cut)} of {len(played)} scripted episodes were cut "
                     f"short (truncated, {reason}; rows up to {longest} tokens), and "
                     f"`agentrl sft` leaves them out; {fix}")
    return lines


def _unfit_turn(envs: list[Any], config: Config, tokenizer: Any, name: str) -> list[str]:
    """The turn whose task and newest turn alone (with the summary kept before it, under a
    summary strategy) pass the budget, with its token counts: no compaction keeps less."""
    budget = config.compaction.max_context_tokens
    worst: tuple[int, int, int] | None = None  # (tokens, kept-before-the-turn tokens, turn)
    for env in envs:
        history = as_dicts(list(getattr(env, "history", [])))
        starts = [i for i, m in enumerate(history) if m["role"] == "assistant"]
        tools = offered_tools(config.compaction.strategy, env.tool_schemas()) or None
        ends = [*starts[1:], len(history)]
        for number, (start, end) in enumerate(zip(starts, ends, strict=True), 1):
            if end - start < 2:  # a final answer: no tool result to keep
                continue
            head = history[: starts[0]]
            if number > 1:  # what a compaction before this turn keeps besides the task
                head = [*head, *_summary(env, config, history[:start]), *_marker(config)]
            tokens = _tokens(tokenizer, head + history[start:end], tools)
            if worst is None or tokens > worst[0]:
                worst = (tokens, _tokens(tokenizer, head, tools), number)
    if worst is None or worst[0] <= budget:
        return []
    tokens, kept, number = worst
    turn = config.rollout.max_new_tokens
    return [f"env {name!r}: turn {number} of a scripted episode cannot fit the context: the "
            f"system prompt, tools, task and what compaction keeps before a turn ({kept} "
            f"tokens) plus that turn's reply and tool result ({tokens - kept} tokens) take "
            f"{tokens} tokens, over compaction.max_context_tokens = {budget}, and no "
            f"compaction keeps less; raise it to at least {tokens + turn} (with one turn of "
            f"rollout.max_new_tokens = {turn}) or make that tool's result (or the summary) "
            "shorter"]


def _marker(config: Config) -> list[dict[str, Any]]:
    """The note drop_oldest leaves where it dropped turns (the tool strategy's fallback)."""
    from agentrl.rollout.compaction import marker_message

    compaction = config.compaction
    budget = compaction.fallback if compaction.strategy == "tool" else compaction.strategy
    return [marker_message(1)] if budget == "drop_oldest" else []


def _summary(env: Any, config: Config, seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary message a summary strategy keeps before a turn (the environment's own
    ``demonstrate_summary``), or none."""
    from agentrl.envs.hook_checks import SUMMARY_STRATEGIES, overrides
    from agentrl.rollout.compaction import SUMMARY_PREFIX
    from agentrl.types import Message

    if config.compaction.strategy not in SUMMARY_STRATEGIES or not overrides(
            env, "demonstrate_summary") or not seen:
        return []
    messages = [Message(m["role"], m["content"], m.get("name")) for m in seen]
    summary = env.demonstrate_summary(messages, True)
    if not isinstance(summary, str):
        return []
    return [{"role": "user", "content": f"{SUMMARY_PREFIX}{summary}"}]


def _tokens(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> int:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    return len(tokenizer.encode(text))

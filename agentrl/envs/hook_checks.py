"""The long-trace hooks checked before any training: ``needed_facts`` and
``demonstrate_summary`` (``AgentEnv``), called on a played episode and type-checked.

``agentrl check-env`` runs :func:`hook_problems` in the environment's worker process after
its scripted episode, so an environment whose hook has the wrong signature or returns the
wrong type is named there, in one line with the fix, instead of surfacing at ``agentrl
sft`` as "none of its demonstrations was correct" or in training as a masked rollout.
"""

from __future__ import annotations

import inspect
from typing import Any

from agentrl.envs.agent_env import AgentEnv
from agentrl.types import Message

PAGE = "docs/writing-environments.md"
NEEDED_FACTS = "needed_facts(self) -> list[str]"
DEMONSTRATE_SUMMARY = "demonstrate_summary(self, messages, forced) -> str | None"
SUMMARY_STRATEGIES = ("summarize", "tool")
"""Strategies whose warm start learns summaries from ``demonstrate_summary``."""


def overrides(env: Any, method: str) -> bool:
    """Whether the environment's class defines its own ``method`` (not AgentEnv's)."""
    own = getattr(type(env), method, None)
    return own is not None and own is not getattr(AgentEnv, method, None)


def hook_problems(env: Any, name: str, reward: float, strategy: str) -> list[str]:
    """One line per broken hook, each naming the environment, the method and the fix.

    Called right after an episode (its conversation is ``env.history``, and ``env.task``
    is still its task); ``reward``: the episode's reward; ``strategy``:
    ``compaction.strategy`` of the config the warm start plays under."""
    transcript = list(getattr(env, "history", []))
    problems = _needed_facts_problems(env, name, transcript, reward)
    if overrides(env, "demonstrate_summary"):
        problems += _summary_problems(env, name, transcript)
    elif strategy in SUMMARY_STRATEGIES and _facts_of(env):
        problems.append(
            f"env {name!r}: compaction.strategy = {strategy!r} and {type(env).__name__} "
            f"declares needed_facts but has no {DEMONSTRATE_SUMMARY}, so `agentrl sft` "
            "demonstrates no summary to keep them; add it, returning the facts seen so far "
            f"when forced and for the compact tool right after a page that held one ({PAGE})")
    return problems


def _facts_of(env: Any) -> list[str]:
    try:
        facts = env.needed_facts()
    except Exception:  # noqa: BLE001 - reported by _needed_facts_problems
        return []
    return list(facts) if isinstance(facts, list | tuple) else []


def _needed_facts_problems(env: Any, name: str, transcript: list[Message],
                           reward: float) -> list[str]:
    if not overrides(env, "needed_facts"):
        return []
    where = f"env {name!r}: {type(env).__name__}.needed_facts"
    extra = _required_parameters(type(env).needed_facts, 0)
    if extra:
        return [f"{where}({', '.join(extra)}) takes arguments; the contract is {NEEDED_FACTS} "
                "(the facts of self.task, the current task): drop the parameters"]
    try:
        facts = env.needed_facts()
    except Exception as exc:  # noqa: BLE001 - any author bug, named
        return [f"{where}() raised {type(exc).__name__}: {_one_line(exc)}; it must return "
                "the current task's facts (read self.task) as a list of str"]
    if not (isinstance(facts, list | tuple) and all(isinstance(f, str) and f for f in facts)):
        return [f"{where}() returned {_describe(facts)}; return a list of non-empty str "
                "copied verbatim from the observations, e.g. [\"amber\", \"onyx\"]"]
    seen = "\n".join(m.content for m in transcript if m.role != "assistant")
    missing = [f for f in facts if f not in seen]
    if missing and reward > 0:
        return [f"{where}() returned {missing[0]!r}, which no observation of the correct "
                "scripted episode holds; return strings exactly as the tools show them, or "
                "compaction/fact_survival measures nothing"]
    return []


def _summary_problems(env: Any, name: str, transcript: list[Message]) -> list[str]:
    where = f"env {name!r}: {type(env).__name__}.demonstrate_summary"
    if _required_parameters(type(env).demonstrate_summary, 2) or not _accepts(
            type(env).demonstrate_summary, 2):
        params = ", ".join(_parameters(type(env).demonstrate_summary))
        return [f"{where}({params}) does not take (messages, forced); the contract is "
                f"{DEMONSTRATE_SUMMARY}"]
    for end, message in enumerate(transcript):
        if message.role != "tool":
            continue
        prefix = list(transcript[: end + 1])
        for forced, seen in ((False, prefix), (True, _through_last_reply(prefix))):
            try:
                summary = env.demonstrate_summary(seen, forced)
            except Exception as exc:  # noqa: BLE001 - any author bug, named
                return [f"{where}(messages, forced={forced}) raised {type(exc).__name__}: "
                        f"{_one_line(exc)}; it is called with the conversation so far "
                        "(never compacted) before every action"]
            if forced and not (isinstance(summary, str) and summary.strip()):
                return [f"{where}(messages, forced=True) returned {_describe(summary)}; when "
                        "forced the context is full and a summary is asked for: return the "
                        "summary text (str), e.g. \"Kept: amber onyx.\""]
            if not forced and not (summary is None or isinstance(summary, str)):
                return [f"{where}(messages, forced=False) returned {_describe(summary)}; "
                        "return the summary to call compact with now (str), or None to act "
                        "without compacting"]
    return []


def _through_last_reply(messages: list[Message]) -> list[Message]:
    """The conversation up to its last assistant message (what a summary request sees)."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return messages[: last + 1]


def _parameters(method: Any) -> list[str]:
    return [p for p in inspect.signature(method).parameters][1:]  # without self


def _required_parameters(method: Any, allowed: int) -> list[str]:
    """Parameters past the first ``allowed`` (after self) that have no default."""
    params = list(inspect.signature(method).parameters.values())[1:]
    return [p.name for p in params[allowed:] if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _accepts(method: Any, count: int) -> bool:
    """Whether the method (after self) takes ``count`` positional arguments."""
    params = list(inspect.signature(method).parameters.values())[1:]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                 p.POSITIONAL_OR_KEYWORD)]) >= count


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}{'…' if len(text) > 60 else ''} ({type(value).__name__})"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]

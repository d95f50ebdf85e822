"""What an environment's methods must return, checked on every call, in one place.

The runner and ``agentrl check-env`` both use these checks, so a violation reads the same
in a training log and in the checker. A violation raises :class:`EnvError` whose ``kind``
is one of :data:`INVALID_KINDS` and whose message names the environment, the method and
the expected type::

    env 'logsearch': step() returned reward 'high' (str); expected a finite float

The contract itself is documented in :mod:`agentrl.envs.agent_env`.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from agentrl.envs.adapters.remote import REMOTE_KINDS
from agentrl.text import is_valid_utf8, short_repr
from agentrl.types import MAIN_THREAD, Message

ROLES = ("system", "user", "assistant", "tool")

INVALID_KINDS = (
    "construct_raised", "construct_timeout",
    "reset_raised", "reset_timeout", "bad_reset",
    "tool_schemas_raised", "tool_schemas_timeout", "bad_tool_schemas",
    "step_raised", "step_timeout", "bad_step",
    "needed_facts_raised", "needed_facts_timeout", "bad_needed_facts",
    "bad_reward", "bad_observation", "bad_info",
    "close_raised", "close_timeout",
    "engine_refused", "engine_unavailable", "rollout_timeout", "row_too_long",
    "worker_died",
    "chat_template_raised",
    *REMOTE_KINDS,
    "grade_raised", "grade_timeout",
    "harness_raised", "harness_timeout", "harness_budget", "harness_foreign_model",
    "harness_bad_request", "harness_bad_final", "harness_bad_answer",
)
"""Why a rollout is invalid, short and stable: the ``<kind>`` of the metrics
``invalid/<kind>`` and ``env/<name>/invalid/<kind>``. ``<method>_raised`` and
``<method>_timeout`` for the constructor, ``reset``, ``tool_schemas``, ``step`` and
``close``; ``bad_*`` for a return value that breaks the contract; ``engine_refused`` (a
context the inference engine would not take), ``engine_unavailable`` (a replica that
cannot be reached), ``rollout_timeout``
(``rollout.rollout_timeout_s``), ``row_too_long`` (a row past the micro-batch budget),
``worker_died`` (the worker process of an ``isolation = "process"`` environment exited
during a call), ``chat_template_raised`` (the checkpoint's chat template refused the
conversation) and the failures of an environment served elsewhere (``env_unreachable``,
``env_server_full``, ``env_disconnected``, ``env_server_error``, ``env_server_timeout``,
``env_bad_reply``: :mod:`agentrl.envs.adapters.remote`).
Agent programs behind the endpoint (docs/harnesses.md): ``harness_raised`` (it crashed or
exited non-zero), ``harness_timeout`` (it hung past its deadline), ``harness_budget`` (more
requests or tokens than its budget), ``harness_foreign_model`` (a model name the endpoint
does not serve), ``harness_bad_request`` (a request the endpoint could not read),
``harness_bad_final`` (a final answer that is not text), ``harness_bad_answer`` (an
answer file that is not a regular file the program owns: a link, a folder, a FIFO);
``grade_*`` for its grader."""

_INFRA, _AMBIGUOUS, _POLICY = "infrastructure", "ambiguous", "policy"
FAILURE_CLASSES: dict[str, str] = {
    **dict.fromkeys(("construct_raised", "construct_timeout", "reset_raised", "reset_timeout",
                     "bad_reset", "tool_schemas_raised", "tool_schemas_timeout",
                     "bad_tool_schemas", "needed_facts_raised", "needed_facts_timeout",
                     "bad_needed_facts", "close_raised", "close_timeout"), _INFRA),
    **dict.fromkeys(("engine_unavailable", "worker_died", "env_unreachable",
                     "env_server_full", "env_disconnected"), _INFRA),
    **dict.fromkeys(("step_raised", "step_timeout", "bad_step", "bad_reward",
                     "bad_observation", "bad_info", "engine_refused", "rollout_timeout",
                     "row_too_long", "env_server_error", "env_server_timeout", "env_bad_reply",
                     "grade_raised", "grade_timeout", "harness_raised", "harness_timeout",
                     "harness_foreign_model", "harness_bad_request", "harness_bad_final",
                     "harness_bad_answer", "chat_template_raised"),
                    _AMBIGUOUS),
    "harness_budget": _POLICY,
}
"""The class of every invalid kind, and so its rule (:mod:`agentrl.rollout.failures`):

- *infrastructure*, retried with a fresh environment up to ``rollout.max_retries`` and
  masked only after: the constructor, ``reset``, ``tool_schemas``, ``needed_facts`` and
  ``close`` failing (none depends on what the policy wrote), a replica out of service
  (``engine_unavailable``), a worker process that died (``worker_died``), a served
  environment that cannot be reached, is full or dropped the connection;
- *ambiguous*, masked and counted (``rollout.ambiguous_failures`` moves them): a step that
  raised, timed out or broke the contract (the action may have caused it), a request the
  engine refused, a rollout timeout, a row too long to pack, a served environment's error
  or timeout, an agent program or its grader that failed, an answer file that is not
  the program's own regular file (a link, a folder, a FIFO: a buggy or hostile program), a
  chat template that refused the conversation the policy's replies made;
- *policy*, a trained outcome (reward: the environment's, or
  ``rollout.failure_rewards[kind]``): an agent program past its own budget
  (``harness_budget``). The policy-caused truncations (``max_rollout_tokens``,
  ``context_budget``, ``max_compactions``, ``tool_errors``) follow the same rule.

Any kind whose rollout failed before the policy generated a token counts as
infrastructure: the policy cannot have caused it (e.g. ``env_server_timeout`` at reset).
"""
assert set(FAILURE_CLASSES) == set(INVALID_KINDS), set(INVALID_KINDS) ^ set(FAILURE_CLASSES)


class EnvError(Exception):
    """A rollout cannot go on: the environment raised, timed out or broke its contract, or
    the engine refused a request. The rollout becomes invalid with this message."""

    def __init__(self, kind: str, message: str, traceback: str | None = None) -> None:
        assert kind in INVALID_KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.traceback = traceback
        """The formatted traceback of the exception behind it, when there was one."""
        self.loop_stall_s = 0.0
        """Seconds the call kept the event loop frozen past its deadline (the GIL)."""


class StepResult(NamedTuple):
    """A checked ``step`` return value: a real list, a finite float, two bools, a dict."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def describe(value: Any) -> str:
    """A value and its type for a violation message: ``'high' (str)``."""
    return f"{short_repr(value)} ({type(value).__name__})"


def check_reset(env: str, result: Any, max_chars: int) -> tuple[list[Message], dict]:
    """``reset`` must return ``(messages, info)``: a non-empty message list and a dict."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvError("bad_reset", f"env {env!r}: reset() returned {_shape(result)}; "
                       "expected a 2-tuple (observation, info)")
    messages, info = result
    messages = check_observation(env, "reset", messages, max_chars)
    if not messages:
        raise EnvError("bad_observation", f"env {env!r}: reset() returned no messages; "
                       "expected the task as a non-empty list of Message")
    return messages, check_info(env, "reset", info)


def check_step(env: str, result: Any, max_chars: int,
               reward_range: tuple[float, float] | None = None,
               method: str = "step") -> StepResult:
    """``step`` must return ``(observation, reward, terminated, truncated, info)`` (and so
    must the subagent protocol's ``thread_step`` and ``complete_step``, named ``method``)."""
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvError("bad_step", f"env {env!r}: {method}() returned {_shape(result)}; "
                       "expected a 5-tuple (observation, reward, terminated, truncated, info)")
    observation, reward, terminated, truncated, info = result
    observation = check_observation(env, method, observation, max_chars)
    value = check_reward(env, reward, reward_range, method)
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool | np.bool_):
            raise EnvError("bad_step", f"env {env!r}: {method}() returned {name} "
                           f"{describe(flag)}; expected a bool")
    return StepResult(observation, value, bool(terminated), bool(truncated),
                      check_info(env, method, info))


def check_reward(env: str, reward: Any, reward_range: tuple[float, float] | None = None,
                 method: str = "step") -> float:
    """A finite real number (bool and int are fine; strings, None, NaN and ±inf are not),
    inside ``reward_range`` when the environment declares one."""
    value = finite_float(reward)
    if value is None:
        raise EnvError("bad_reward", f"env {env!r}: {method}() returned reward "
                       f"{describe(reward)}; expected a finite float")
    if reward_range is not None and not reward_range[0] <= value <= reward_range[1]:
        low, high = reward_range
        raise EnvError("bad_reward", f"env {env!r}: {method}() returned reward {value!r}, "
                       f"outside the declared reward_range [{low}, {high}]")
    return value


def check_subagent_step(env: str, result: StepResult, method: str, thread_id: str,
                        known: set[str], max_chars: int) -> list[Any]:
    """The subagent protocol on a checked step of thread ``thread_id``: the calls it asks
    for (``info["subagent_calls"]``; [] when none), each a ``SubagentCall`` of this thread
    with a new id (``known``: the ids so far; the new ones are added); a subagent thread's
    step earns 0.0 and its answer is a str. See ``agentrl.envs.subagents``."""
    from agentrl.envs.subagents import SubagentCall

    where = f"env {env!r}: {method}() of thread {thread_id!r}"
    if thread_id != MAIN_THREAD and result.reward != 0.0:
        raise EnvError("bad_reward", f"{where} returned reward {result.reward!r}; a subagent's "
                       "steps earn nothing (the rollout's one reward comes from the main "
                       "thread), expected 0.0")
    answer = result.info.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise EnvError("bad_info", f"{where} returned info['answer'] = {describe(answer)}; "
                       "expected the subagent's answer as a str")
    calls = result.info.get("subagent_calls")
    if calls is None:
        return []
    expected = "expected a non-empty list of agentrl.envs.subagents.SubagentCall"
    if method == "complete_step" or result.terminated or result.truncated:
        raise EnvError("bad_info", f"{where} returned info['subagent_calls'] in a step that "
                       "ends its turn; subagent calls come from a step that waits for them")
    if not (isinstance(calls, list) and calls):
        raise EnvError("bad_info", f"{where} returned info['subagent_calls'] = "
                       f"{describe(calls)}; {expected}")
    for call in calls:
        if not isinstance(call, SubagentCall):
            raise EnvError("bad_info", f"{where} returned a subagent call {describe(call)}; "
                           f"{expected}")
        problem = _call_problem(call, thread_id, known)
        if problem:
            raise EnvError("bad_info", f"{where} returned subagent call "
                           f"{short_repr(call.thread_id)} {problem}")
        check_observation(env, method, call.messages, max_chars)
        check_tool_schemas(env, call.tools)
        known.add(call.thread_id)
    return calls


def _call_problem(call: Any, thread_id: str, known: set[str]) -> str | None:
    if call.parent != thread_id:
        return f"with parent {call.parent!r}; expected {thread_id!r}, the calling thread"
    if not isinstance(call.thread_id, str) or not call.thread_id or call.thread_id in known \
            or call.thread_id == MAIN_THREAD:
        return "whose id is empty, 'main' or already used; each thread needs a new id"
    if not isinstance(call.messages, list) or not call.messages:
        return "without opening messages; expected its system prompt and task as Messages"
    return None


def scaled_reward(env: str, reward: float, scale: float) -> tuple[float, EnvError | None]:
    """(reward × scale, None), or (0.0, a ``bad_reward`` error) when the product is not
    finite (a sum past the float range, a nan/inf ``reward_scale``): the one guard of
    every rollout's reward; the 0.0 keeps an invalid rollout's reward comparable."""
    scaled = reward * scale
    if math.isfinite(scaled):
        return scaled, None
    return 0.0, EnvError("bad_reward", f"env {env!r}: the rollout's reward {reward!r} x "
                         f"reward_scale {scale!r} = {scaled!r}; expected a finite float")


def finite_float(value: Any) -> float | None:
    """The value as a finite float when it is a real number (bool, int, float, numpy
    scalar); None for anything else, for NaN, ±inf and ints past the float range."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def check_observation(env: str, method: str, observation: Any, max_chars: int) -> list[Message]:
    """A list of :class:`Message` with known roles, ``str`` content that encodes as UTF-8,
    and at most ``max_chars`` characters of content in all (``rollout.max_observation_chars``)."""
    expected = "expected a list of agentrl.types.Message"
    if not isinstance(observation, list):
        raise EnvError("bad_observation", f"env {env!r}: {method}() returned observation "
                       f"{describe(observation)}; {expected}")
    total = 0
    for index, message in enumerate(observation):
        where = f"env {env!r}: {method}() returned observation[{index}]"
        if not isinstance(message, Message):
            raise EnvError("bad_observation", f"{where} = {describe(message)}; {expected}")
        problem = _message_problem(message)
        if problem:
            raise EnvError("bad_observation", f"{where} with {problem}")
        total += len(message.content)
    if total > max_chars:
        raise EnvError("bad_observation", f"env {env!r}: {method}() returned an observation of "
                       f"{total} characters, more than rollout.max_observation_chars = "
                       f"{max_chars}; an environment must bound what it returns")
    return observation


def _message_problem(message: Message) -> str | None:
    if message.role not in ROLES:
        return f"role {describe(message.role)}; expected one of {ROLES}"
    if not isinstance(message.content, str):
        return f"content {describe(message.content)}; expected a str"
    if message.name is not None and not isinstance(message.name, str):
        return f"name {describe(message.name)}; expected a str or None"
    for field, text in (("content", message.content), ("name", message.name or "")):
        if not is_valid_utf8(text):
            return (f"{field} holding a lone surrogate (not encodable as UTF-8); expected "
                    "valid text (agentrl.text.valid_utf8 repairs it)")
    return None


def check_info(env: str, method: str, info: Any) -> dict[str, Any]:
    """``info`` must be a dict; ``tool_errors`` and ``reward_components`` (when present)
    dicts of name -> number, since the runner sums and logs them."""
    if not isinstance(info, dict):
        raise EnvError("bad_info", f"env {env!r}: {method}() returned info {describe(info)}; "
                       "expected a dict")
    for key in ("tool_errors", "reward_components"):
        value = info.get(key)
        if value is None:
            continue
        if not (isinstance(value, dict) and all(
                isinstance(k, str) and finite_float(v) is not None for k, v in value.items())):
            raise EnvError("bad_info", f"env {env!r}: {method}() returned info[{key!r}] = "
                           f"{describe(value)}; expected a dict of str -> finite number")
    return info


def check_tool_schemas(env: str, schemas: Any) -> list[dict[str, Any]]:
    """A list of JSON-serializable dicts (OpenAI function schemas), maybe empty."""
    if not (isinstance(schemas, list) and all(isinstance(s, dict) for s in schemas)):
        raise EnvError("bad_tool_schemas", f"env {env!r}: tool_schemas() returned "
                       f"{describe(schemas)}; expected a list of dicts")
    try:
        json.dumps(schemas)
    except (TypeError, ValueError) as exc:
        raise EnvError("bad_tool_schemas", f"env {env!r}: tool_schemas() returned a schema "
                       f"that is not JSON ({exc}); expected a list of JSON objects") from None
    return schemas


def check_needed_facts(env: str, facts: Any) -> list[str]:
    """A list of non-empty strings (the facts a compaction must keep), maybe empty."""
    if not (isinstance(facts, list | tuple)
            and all(isinstance(f, str) and f for f in facts)):
        raise EnvError("bad_needed_facts", f"env {env!r}: needed_facts() returned "
                       f"{describe(facts)}; expected a list of non-empty str")
    return list(facts)


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return describe(value)

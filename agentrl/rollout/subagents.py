"""Subagent threads: one rollout as a tree of conversations under one policy.

When a thread's step asks for subagents (``info["subagent_calls"]``, the protocol of
:mod:`agentrl.envs.subagents`), :class:`RolloutTree` plays each call as a thread of its
own: the same multi-turn loop as the main thread
(:class:`agentrl.rollout.multi_turn.RolloutPlayer`) over a :class:`ThreadView` of the
environment, with its own context window and compactor, its engine requests keyed by the
thread (:func:`thread_key`: the router keeps each thread on one replica, its prefix
cache) and its own budgets: turns ``min(rollout.max_turns, the call's max_turns)``,
generated tokens ``min(rollout.max_subagent_tokens, the call's max_tokens)``. The calls
of one step run concurrently; their answers go back through ``complete_step`` and the
parent's turn goes on.

Limits and failures, by reason (:data:`agentrl.types.SUBAGENT_FAILURES`, in
``Thread.error_kind``): a
call past ``rollout.max_subagent_depth`` (``depth_limit``) or past
``rollout.max_subagents_per_rollout`` (``count_limit``) starts nothing; a thread that ends
without an answer (``max_turns``, ``max_tokens``, ``context_budget``,
``max_compactions``) returns an error result. Either way the caller reads
``Error (subagent_<reason>): ...`` and may go on, and the rollout stays valid: these are
the policy's own choices, and it is trained on them.

A failure of the environment or the engine inside a subagent thread (a step that raised,
timed out or broke the contract; a refused request) is a failure of the rollout, as in the
main thread: it becomes invalid with that kind (one bad row masks the whole rollout), the
other threads are cancelled, and the message names the thread. The deadlines are those of
any step (``rollout.step_timeout_s`` per environment call) and of the rollout
(``rollout.rollout_timeout_s`` over the whole tree).

Every thread's segments are rows of the one rollout (``Segment.thread``): the main
thread's first, then each subagent's in thread-id order; ``Rollout.threads`` is the tree.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from typing import Any

import msgspec

from agentrl.config import CompactionConfig, RolloutConfig
from agentrl.engines.interface import InferenceEngine
from agentrl.envs.subagents import SubagentCall, SubagentResult
from agentrl.rollout.env_contract import EnvError, StepResult
from agentrl.types import MAIN_THREAD, Message, Rollout, RolloutStats, Thread

_NO_ANSWER = {"max_turns": "max_turns", "env": "max_turns", "max_rollout_tokens": "max_tokens",
              "context_budget": "context_budget", "max_compactions": "max_compactions"}
"""A subagent thread's truncation reason -> its failure reason."""
KEY_SEPARATOR = "#"


def thread_key(rollout_id: str, thread_id: str) -> str:
    """The engine request key of a thread: the rollout's id for the main thread,
    ``<rollout id>#<thread id>`` for a subagent (so each thread keeps its replica)."""
    return rollout_id if thread_id == MAIN_THREAD else f"{rollout_id}{KEY_SEPARATOR}{thread_id}"


def split_thread_key(key: str) -> tuple[str, str]:
    """``(rollout id, thread id)`` of a request key made by :func:`thread_key`."""
    rollout_id, separator, thread_id = key.rpartition(KEY_SEPARATOR)
    return (rollout_id, thread_id) if separator else (key, MAIN_THREAD)


def thread_order(thread_id: str) -> list[int]:
    """Sort key of thread ids: "2" < "2.1" < "10"."""
    return [int(part) for part in re.findall(r"\d+", thread_id)]


class ThreadView:
    """One thread's side of the environment, as the multi-turn loop calls it: the main
    thread's ``reset``/``step``, or a subagent's opening messages and ``thread_step``; a
    step that asks for subagents returns once they answered."""

    def __init__(self, tree: RolloutTree, thread_id: str = MAIN_THREAD, depth: int = 0,
                 call: SubagentCall | None = None) -> None:
        """``call``: the subagent call that started this thread (None: the main thread)."""
        self.tree = tree
        self.thread_id = thread_id
        self.depth = depth
        self.call = call
        self.answer: str | None = None

    async def reset(self, seed: int | None, options: dict | None = None) -> list[Message]:
        """The main thread's task, or the subagent's system prompt and task."""
        if self.call is None:
            return await self.tree.env.reset(seed, options)
        return [msgspec.structs.replace(m) for m in self.call.messages]

    async def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools this thread is offered."""
        if self.call is None:
            return await self.tree.env.tool_schemas()
        return list(self.call.tools)

    async def needed_facts(self) -> list[str]:
        """What the task's answer needs (the main thread's, ``AgentEnv.needed_facts``); a
        subagent's thread declares none (its task is the call's, not the episode's)."""
        if self.call is None:
            return await self.tree.env.needed_facts()
        return []

    async def step(self, action: str) -> StepResult:
        """One turn; subagent calls it makes are played before it returns."""
        env = self.tree.env
        if self.call is None:
            result = await env.step(action)
        else:
            result = await env.thread_step(self.thread_id, action)
        calls = result.info.get("subagent_calls")
        if calls:
            results = await self.tree.run_calls(self, calls)
            result = await env.complete_step(self.thread_id, results)
        if result.terminated and self.call is not None:
            self.answer = result.info.get("answer", action)
        return result


class _Child(msgspec.Struct):
    """A subagent thread being played: its node, its view, its loop."""

    node: Thread
    view: ThreadView
    player: Any
    rollout: Rollout | None = None
    """The thread's result once its loop ended (None while it runs, or if cut off)."""


class RolloutTree:
    """The threads of one rollout: plays the subagent calls its threads make."""

    def __init__(self, spec: Any, env: Any, engine: InferenceEngine, tokenizer: Any,
                 rollout: RolloutConfig, compaction: CompactionConfig,
                 player_class: type) -> None:
        """``env``: the rollout's :class:`GuardedEnv`; ``player_class``: the multi-turn
        loop (``RolloutPlayer``) every thread runs."""
        self.spec = spec
        self.env = env
        self.engine = engine
        self.tokenizer = tokenizer
        self.rollout = rollout
        self.compaction = compaction
        self.player_class = player_class
        self.children: dict[str, _Child] = {}
        self.refused: list[Thread] = []
        self.num_started = 0
        self.failure: EnvError | None = None
        """The first environment or engine failure in a subagent thread, if any."""

    def main_view(self) -> ThreadView:
        """The view the main thread's loop plays."""
        return ThreadView(self)

    async def run_calls(self, parent: ThreadView, calls: list[SubagentCall]
                        ) -> list[SubagentResult]:
        """Each call's result, in order: refused past a limit, else its thread played
        (the allowed ones concurrently). An environment or engine failure in any thread
        cancels the others and is raised (the rollout is invalid)."""
        results: dict[str, SubagentResult] = {}
        started: list[SubagentCall] = []
        for call in calls:  # the limits are applied in call order: deterministic
            refusal = self._refusal(call, parent.depth + 1)
            if refusal is not None:
                results[call.thread_id] = refusal
            else:
                self.num_started += 1
                started.append(call)
        tasks = [asyncio.ensure_future(self._play(parent, call)) for call in started]
        try:
            for call, outcome in zip(started, await asyncio.gather(*tasks), strict=True):
                results[call.thread_id] = outcome
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [results[call.thread_id] for call in calls]

    def _refusal(self, call: SubagentCall, depth: int) -> SubagentResult | None:
        limit = self.rollout
        if depth > limit.max_subagent_depth:
            kind, text = "depth_limit", (
                f"subagents may be nested {limit.max_subagent_depth} deep "
                "(rollout.max_subagent_depth); this call would start one at depth "
                f"{depth}, so it did not run. Do this part yourself.")
        elif self.num_started >= limit.max_subagents_per_rollout:
            kind, text = "count_limit", (
                f"this rollout already started its {limit.max_subagents_per_rollout} "
                "subagents (rollout.max_subagents_per_rollout), so this call did not run. "
                "Go on with the answers you have.")
        else:
            return None
        self.refused.append(Thread(call.thread_id, call.parent, depth, call.origin,
                                   error=text, error_kind=kind))
        return SubagentResult(call.thread_id, error=text, error_kind=kind)

    async def _play(self, parent: ThreadView, call: SubagentCall) -> SubagentResult:
        """Play one subagent thread to its end; its answer, or why there is none."""
        depth = parent.depth + 1
        view = ThreadView(self, call.thread_id, depth, call)
        max_tokens = min(self.rollout.max_subagent_tokens,
                         call.max_tokens or self.rollout.max_subagent_tokens)
        config = msgspec.structs.replace(
            self.rollout, max_rollout_tokens=max_tokens,
            max_turns=min(self.rollout.max_turns, call.max_turns or self.rollout.max_turns))
        spec = msgspec.structs.replace(
            self.spec, rollout_id=thread_key(self.spec.rollout_id, call.thread_id),
            sampling_seed=_thread_seed(self.spec.sampling_seed, call.thread_id),
            reward_scale=1.0)
        player = self.player_class(spec, view, self.engine, self.tokenizer, config,
                                   self.compaction)
        node = Thread(call.thread_id, call.parent, depth, call.origin)
        child = self.children[call.thread_id] = _Child(node, view, player)
        played = await player.play()
        if player.failure is not None:  # the environment or the engine failed: rollout over
            if self.failure is None:  # the first failure; threads it cuts off say so
                child.rollout = played
                node.error, node.error_kind = str(player.failure), player.failure.kind
                self.failure = in_thread(player.failure, call)
            raise self.failure
        child.rollout = played
        if view.answer is not None:
            node.answer = view.answer
            return SubagentResult(call.thread_id, answer=view.answer)
        stats = child.rollout.stats
        kind = _NO_ANSWER.get(stats.truncation_reason or "", "max_turns")
        node.error, node.error_kind = _no_answer_text(call, kind, config), kind
        return SubagentResult(call.thread_id, error=node.error, error_kind=kind)

    def attach(self, result: Rollout) -> Rollout:
        """The rollout with every thread's segments after the main thread's, the tree in
        ``threads``, and the counts summed over threads (see ``RolloutStats``)."""
        threads = [*self.refused]
        for thread_id in sorted(self.children, key=thread_order):
            child = self.children[thread_id]
            played = child.rollout if child.rollout is not None else child.player.result()
            if child.rollout is None and child.node.error is None:
                child.node.error_kind = result.stats.error_kind or "cut_off"
                child.node.error = "cut off: " + (result.stats.error or "the rollout ended")
            for segment in played.segments:
                segment.thread = thread_id
            result.stats.compactions.extend(  # numbered by the rollout's rows
                msgspec.structs.replace(c, segment=c.segment + len(result.segments))
                for c in played.stats.compactions)
            result.segments.extend(played.segments)
            child.node.stats = played.stats
            threads.append(child.node)
        result.threads = sorted(threads, key=lambda t: thread_order(t.thread_id))
        _add_thread_counts(result.stats, [t.stats for t in threads])
        return result


def in_thread(failure: EnvError, call: SubagentCall) -> EnvError:
    """The failure, its message naming the subagent thread it happened in (training and
    ``agentrl check-env`` report it in these words)."""
    error = EnvError(failure.kind, f"subagent thread {call.thread_id} ({call.origin}): "
                     f"{failure}", failure.traceback)
    error.loop_stall_s = failure.loop_stall_s
    return error


def _no_answer_text(call: SubagentCall, kind: str, config: RolloutConfig) -> str:
    why = {
        "max_turns": f"it used its {config.max_turns} turns without a final reply",
        "max_tokens": f"it generated its {config.max_rollout_tokens} tokens "
                      "(rollout.max_subagent_tokens) without a final reply",
        "context_budget": "its task and newest turn no longer fit its context window",
        "max_compactions": "its context needed more compactions than "
                           "compaction.max_compactions allows",
    }[kind]
    return f"the subagent {call.name} (thread {call.thread_id}) gave no answer: {why}."


def _thread_seed(seed: int | None, thread_id: str) -> int | None:
    """A sampling seed for a subagent thread, fixed by the rollout's seed and the id."""
    return None if seed is None else random.Random(f"{seed}:{thread_id}").getrandbits(31)


def _add_thread_counts(total: RolloutStats, threads: list[RolloutStats]) -> None:
    """Add the subagent threads' turns, compactions, tokens and tool errors to the
    rollout's counts (the main thread's)."""
    errors = Counter(total.tool_errors)
    for stats in threads:
        total.num_turns += stats.num_turns
        total.num_compactions += stats.num_compactions
        total.num_generated_tokens += stats.num_generated_tokens
        errors.update(stats.tool_errors)
    total.tool_errors = dict(errors)

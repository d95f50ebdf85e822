"""Demonstrations played through the rollout runner: a scripted engine in the model's place.

Every demonstration row then has exactly the token layout RL will see (chat template,
tool-response deltas, compaction). Where they come from (each environment's
``demonstrate()`` hook or a JSONL of trajectories) is ``agentrl.envs.demonstrations``.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.config import Config, ConfigError, EnvironmentConfig
from agentrl.engines.interface import Generation, SamplingParams
from agentrl.envs.demonstrations import (
    Policy,
    ReplayPolicy,
    demonstration_policies,
    thread_messages,
)
from agentrl.envs.tools import format_call
from agentrl.rollout.compact_tool import COMPACT_TOOL
from agentrl.rollout.compaction import SUMMARY_REQUEST
from agentrl.rollout.request_keys import is_session, split_key
from agentrl.sampler import EnvironmentSampler, TaskDraw
from agentrl.types import MAIN_THREAD, Rollout


class DemoEngine:
    """An ``InferenceEngine`` whose replies are the scripted policy's text (log-probs 0).

    An agent program (a ``harness`` environment) plays against it through the endpoint,
    running its own tools: its n-th request is answered with the trajectory's n-th
    action, so the rows have exactly the layout the program's RL rollouts have.

    Compaction by summary is played too: a summary request (strategy ``summarize``, or
    the tool strategy's fallback) is answered with ``env.demonstrate_summary(history,
    forced=True)``; with strategy ``tool``, before each new action the environment is
    asked whether to compact now (``forced=False``) and a summary becomes a ``compact``
    call, in the ``compact_share`` of the rollouts that compact on their own (the others
    leave every compaction to the budget's fallback: a weaker demonstrator, whose warm
    start RL can teach when to compact).
    """

    def __init__(self, tokenizer: Any, strategy: str = "none",
                 compact_share: float = 1.0) -> None:
        """The tokenizer encodes the policy's text into the reply's ids; ``strategy`` is
        ``compaction.strategy``; ``compact_share`` in [0, 1]."""
        if not 0.0 <= compact_share <= 1.0:
            raise ValueError(f"compact_share is {compact_share}; it must be in [0, 1]")
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.compact_share = compact_share
        self.playing: dict[str, tuple[str, Any, Policy]] = {}
        """Rollout id → (environment name, environment, policy): filled by the runner's
        factory as it builds each rollout's instance (``episode.CURRENT_ROLLOUT``); the
        engine's requests carry the rollout id as their key (a subagent thread's key adds
        its thread id, an agent program's its session: ``agentrl.rollout.request_keys``)."""
        self.requests: Counter[str] = Counter()
        """Agent programs' session id → requests answered (the next action's index)."""
        self.asked_at: dict[str, int] = {}
        """Request key (a thread of a rollout) → that thread's history length when the
        tool strategy last asked to compact."""

    weight_version = 0
    """A script has one version."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Ask this rollout's policy (or its summary hook); encode its reply plus the
        end-of-turn token.

        A policy that fails, returns nothing, or writes more than ``max_tokens`` raises
        ValueError, which the runner turns into an invalid rollout with that reason.
        """
        key = key or ""
        rollout_id, thread_id = split_key(key)
        program = is_session(thread_id)
        if program:  # an agent program's request: its key is its session's id
            thread_id = MAIN_THREAD
        if rollout_id not in self.playing:
            raise ValueError(f"request key {key!r} names no rollout being demonstrated")
        name, env, policy = self.playing[rollout_id]
        where = "" if thread_id == MAIN_THREAD else f" of subagent thread {thread_id}"
        try:
            text = (self._program_reply(key, env, policy) if program
                    else self._reply(key, thread_id, prompt_ids, env, policy))
        except Exception as exc:  # a bug in a scripted policy: report it, do not crash
            raise ValueError(f"{name}: the demonstration{where} raised "
                             f"{type(exc).__name__}: {exc}") from exc
        if text is None:  # the turn asked for: the program's request already counted
            turn = (self.requests[key] - 1 if program else
                    sum(1 for m in thread_messages(env, thread_id) if m.role == "assistant"))
            raise ValueError(f"{name}: the demonstration gave no message for turn "
                             f"{turn + 1}{where}")
        ids = self.tokenizer.encode(text)
        if len(ids) > params.max_tokens - 1:
            raise ValueError(f"{name}: a demonstration message is {len(ids)} tokens, over the "
                             f"{params.max_tokens - 1} a turn allows; raise "
                             "rollout.max_new_tokens (or rollout.max_rollout_tokens, "
                             "compaction.summary_max_tokens)")
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [0.0] * len(ids), "stop")

    def _program_reply(self, key: str, env: Any, policy: Policy) -> str | None:
        """The trajectory's next action for an agent program's session: its requests are
        counted here (the program, not the environment, holds the conversation)."""
        if not isinstance(policy, ReplayPolicy):
            raise TypeError("an agent program is demonstrated only from --demonstrations "
                            "trajectories (its environment's demonstrate() hook cannot see "
                            "the program's conversation)")
        turn = self.requests[key]
        self.requests[key] += 1
        return policy.action(env, MAIN_THREAD, turn)

    def _reply(self, key: str, thread_id: str, prompt_ids: list[int], env: Any,
               policy: Policy) -> str | None:
        """The summary asked for, a ``compact`` call the environment wants now, or the
        policy's next action, all in the thread the request comes from."""
        history = thread_messages(env, thread_id)
        if self._asks_for_summary(prompt_ids):
            # the request comes before the newest tool result: summarize what was seen
            seen = history[: max(i for i, m in enumerate(history)
                                 if m.role == "assistant") + 1]
            summary = getattr(env, "demonstrate_summary", lambda *_: None)(seen, True)
            if summary is None:
                raise ValueError("a summary was asked for and demonstrate_summary(messages, "
                                 "forced=True) returned None; implement it to warm-start "
                                 "compaction by summary")
            return summary
        if (self.strategy == "tool" and self.asked_at.get(key) != len(history)
                and self.compacts_on_its_own(key)):
            self.asked_at[key] = len(history)
            summary = getattr(env, "demonstrate_summary", lambda *_: None)(history, False)
            if summary is not None:
                return format_call(COMPACT_TOOL, summary=summary)
        return policy(env, thread_id)

    def compacts_on_its_own(self, key: str) -> bool:
        """Whether the rollout of this request key is one of the ``compact_share`` that
        call ``compact`` themselves (a stable draw from the rollout id)."""
        rollout_id, _ = split_key(key)
        return zlib.crc32(rollout_id.encode()) / 2**32 < self.compact_share

    def _asks_for_summary(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt ends with the summary request (the summarize compactor)."""
        tail = self.tokenizer.decode(prompt_ids[-4 * len(SUMMARY_REQUEST):])
        return SUMMARY_REQUEST in tail[-2 * len(SUMMARY_REQUEST):]

    def update_weights(self, named_tensors: Any, version: int | None = None) -> None:
        """Nothing to update: the policy is a script."""


class DemoSampler:
    """Environments by weight (``EnvironmentSampler``); file-backed environments take
    their task seeds from their trajectories, in turn."""

    def __init__(self, weights: dict[str, float], seed: int,
                 seeds_by_env: dict[str, list[int]]) -> None:
        """``seeds_by_env``: the task seeds of each file-backed environment."""
        self.inner = EnvironmentSampler(weights, seed)
        self.seeds_by_env = seeds_by_env
        self.used: Counter[str] = Counter()

    def sample_tasks(self, num_groups: int) -> list[TaskDraw]:
        """The weighted draws, with file seeds where an environment has them."""
        return [self._with_file_seed(d) for d in self.inner.sample_tasks(num_groups)]

    def tasks_of(self, env: str, num_groups: int) -> list[TaskDraw]:
        """Replacement tasks of one environment (``EnvironmentSampler.tasks_of``)."""
        return [self._with_file_seed(d) for d in self.inner.tasks_of(env, num_groups)]

    def _with_file_seed(self, draw: TaskDraw) -> TaskDraw:
        seeds = self.seeds_by_env.get(draw.env)
        if not seeds:
            return draw
        self.used[draw.env] += 1
        return TaskDraw(draw.env, seeds[(self.used[draw.env] - 1) % len(seeds)])


async def play_demonstrations(
    config: Config, tokenizer: Any, num_rollouts: int, seed: int,
    policies: dict[str, Policy] | None = None, log: Callable[[str], None] | None = None,
    compact_share: float = 1.0, played: list[Rollout] | None = None,
) -> list[Rollout]:
    """Correct rollouts of each environment's demonstrations, in its weight's share, with
    the runner's exact token layout (``compact_share``: see ``DemoEngine``). Refuses when
    an environment has no correct one. ``played``, when given, receives every rollout
    played, correct or not, before that check (``agentrl check-env`` reports the others)."""
    from agentrl.envs.registry import make
    from agentrl.rollout.episode import CURRENT_ROLLOUT
    from agentrl.rollout.runner import RolloutRunner

    policies = policies if policies is not None else demonstration_policies(config)
    single = msgspec.structs.replace(
        config,
        batch=msgspec.structs.replace(config.batch, n_samples_per_prompt=1),
        environments=[msgspec.structs.replace(e, group_size=1) for e in config.environments],
    )

    engine = DemoEngine(tokenizer, config.compaction.strategy, compact_share)

    def make_env(env_config: EnvironmentConfig) -> Any:
        env = make(env_config.id, **env_config.kwargs)
        name = env_config.display_name()
        engine.playing[CURRENT_ROLLOUT.get().rollout_id] = (name, env, policies[name])
        return env

    seeds = {name: p.seeds for name, p in policies.items() if isinstance(p, ReplayPolicy)}
    sampler = DemoSampler({e.display_name(): e.weight for e in config.environments}, seed,
                          seeds)
    runner = RolloutRunner(single, engine, tokenizer, sampler, make_env=make_env)
    rollouts = (await runner.collect(0, num_rollouts)).rollouts
    if played is not None:
        played.extend(rollouts)
    # in rollout-id order, not finishing order: a warm start's seeded row sampling then
    # draws the same rows on every run
    correct = sorted((r for r in rollouts if r.valid and r.reward > 0),
                     key=lambda r: r.rollout_id)
    report = demonstration_report(rollouts, [e.display_name() for e in config.environments])
    if log is not None:
        log(report)
    return correct


def demonstration_report(rollouts: list[Rollout], names: list[str]) -> str:
    """Played and correct demonstrations per environment; raises when one has none correct."""
    lines = ["demonstrations per environment (played in its weight's share):"]
    for name in names:
        mine = [r for r in rollouts if r.env == name]
        good = [r for r in mine if r.valid and r.reward > 0]
        failed = [r for r in mine if not (r.valid and r.reward > 0)]
        line = f"  {name}: {len(mine)} played, {len(good)} correct"
        if failed:
            line += f"; {len(failed)} left out, the first because {failure_reason(failed[0])}"
        lines.append(line)
        if mine and not good:
            raise ConfigError(
                f"environment {name!r}: none of its {len(mine)} demonstrations was correct; "
                f"the first failed because {failure_reason(failed[0])}. Play one with "
                "`agentrl check-env ID` to see the episode")
    return "\n".join(lines)


def failure_reason(rollout: Rollout) -> str:
    """Why a demonstration is not trained on, in words."""
    if rollout.stats.error:
        return rollout.stats.error
    if rollout.stats.truncated:
        return f"it was truncated ({rollout.stats.truncation_reason})"
    return f"the environment graded it {rollout.reward:g}"

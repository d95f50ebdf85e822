"""Demonstrations played through the rollout runner: a scripted engine in the model's place.

Every demonstration row then has exactly the token layout RL will see (chat template,
tool-response deltas, compaction). Where they come from (each environment's
``demonstrate()`` hook or a JSONL of trajectories) is ``agentrl.envs.demonstrations``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from agentrl.config import Config, ConfigError, EnvironmentConfig
from agentrl.engines.interface import Generation, SamplingParams
from agentrl.envs.demonstrations import Policy, ReplayPolicy, demonstration_policies
from agentrl.sampler import EnvironmentSampler, TaskDraw
from agentrl.types import Rollout


class DemoEngine:
    """An ``InferenceEngine`` whose replies are the scripted policy's text (log-probs 0)."""

    def __init__(self, tokenizer: Any) -> None:
        """The tokenizer encodes the policy's text into the reply's ids."""
        self.tokenizer = tokenizer
        self.playing: dict[str, tuple[str, Any, Policy]] = {}
        """Rollout id → (environment name, environment, policy): filled by the runner's
        factory as it builds each rollout's instance (``episode.CURRENT_ROLLOUT``); the
        engine's requests carry the rollout id as their key."""

    weight_version = 0
    """A script has one version."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Ask this rollout's policy; encode its reply plus the end-of-turn token.

        A policy that fails, returns nothing, or writes more than ``max_tokens`` raises
        ValueError, which the runner turns into an invalid rollout with that reason.
        """
        name, env, policy = self.playing[key]
        try:
            text = policy(env)
        except Exception as exc:  # a bug in a scripted policy: report it, do not crash
            raise ValueError(f"{name}: the demonstration raised {type(exc).__name__}: "
                             f"{exc}") from exc
        if text is None:
            raise ValueError(f"{name}: the demonstration gave no message for turn "
                             f"{sum(1 for m in env.history if m.role == 'assistant') + 1}")
        ids = self.tokenizer.encode(text)
        if len(ids) > params.max_tokens - 1:
            raise ValueError(f"{name}: a demonstration message is {len(ids)} tokens, over the "
                             f"{params.max_tokens - 1} a turn allows; raise "
                             "rollout.max_new_tokens (or rollout.max_rollout_tokens)")
        ids.append(self.tokenizer.eos_token_id)
        return Generation(ids, [0.0] * len(ids), "stop")

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
        draws = []
        for draw in self.inner.sample_tasks(num_groups):
            seeds = self.seeds_by_env.get(draw.env)
            if seeds:
                draw = TaskDraw(draw.env, seeds[self.used[draw.env] % len(seeds)])
                self.used[draw.env] += 1
            draws.append(draw)
        return draws


async def play_demonstrations(
    config: Config, tokenizer: Any, num_rollouts: int, seed: int,
    policies: dict[str, Policy] | None = None, log: Callable[[str], None] | None = None,
) -> list[Rollout]:
    """Correct rollouts of each environment's demonstrations, in its weight's share, with
    the runner's exact token layout. Refuses when an environment has no correct one."""
    from agentrl.envs.registry import make
    from agentrl.rollout.episode import CURRENT_ROLLOUT
    from agentrl.rollout.runner import RolloutRunner

    if config.compaction.strategy == "summarize":
        raise ConfigError(
            'compaction.strategy = "summarize" asks the model for a summary, and a '
            "demonstration has none to give (its scripted reply would be trained on as the "
            'summary); warm-start with --set compaction.strategy="drop_oldest", then train '
            "with summarize")
    policies = policies if policies is not None else demonstration_policies(config)
    single = msgspec.structs.replace(
        config,
        batch=msgspec.structs.replace(config.batch, n_samples_per_prompt=1),
        environments=[msgspec.structs.replace(e, group_size=1) for e in config.environments],
    )

    engine = DemoEngine(tokenizer)

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
    correct = [r for r in rollouts if r.valid and r.reward > 0]
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

"""Demonstrations: correct episodes of every environment, played through the rollout runner.

``agentrl sft`` warm-starts a model on them. They are *played*, not rendered: a scripted
engine (:class:`DemoEngine`) stands in for the model inside the ordinary rollout runner,
so every demonstration row has exactly the token layout RL will see (chat template,
tool-response deltas, compaction), and its ``loss_mask`` marks what the policy must learn.

Each environment of the config needs one source (checked before anything runs):

- its scripted policy, the ``AgentEnv.demonstrate(messages)`` hook; or
- trajectories from a JSONL file (``agentrl sft --demonstrations FILE``), one per line::

      {"env": "logsearch", "seed": 3, "actions": ["<tool_call>...</tool_call>", "..."]}

  ``env``: the environment's name in the config (its ``name``, else the id's last part);
  ``seed``: the task seed (the task ``env.reset(seed=seed)`` draws); ``actions``: the
  assistant messages in order. The tool results come from replaying the actions in the
  environment, and only trajectories the environment grades above 0 are trained on. A
  file's trajectories take precedence over the hook for the environments it names.

Each environment gets its weight's share of the demonstrations, and the count played and
correct per environment is reported; an environment none of whose demonstrations is
correct stops the warm start with the first failure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from agentrl.config import Config, ConfigError, EnvironmentConfig
from agentrl.env import has_demonstration
from agentrl.rollout.engine import Generation, SamplingParams
from agentrl.sampler import EnvironmentSampler, TaskDraw
from agentrl.types import Rollout

Policy = Callable[[Any], "str | None"]
"""A scripted policy: the environment (mid-episode) → the next assistant message."""


class Trajectory(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a demonstrations JSONL file."""

    env: str
    seed: int
    actions: list[str]


def load_trajectories(paths: Iterable[str | Path]) -> dict[str, list[Trajectory]]:
    """Trajectories by environment name, from JSONL files; errors name the file and line."""
    found: dict[str, list[Trajectory]] = defaultdict(list)
    for path in map(Path, paths):
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"--demonstrations {path}: cannot read it ({exc})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                trajectory = msgspec.json.decode(line, type=Trajectory)
            except msgspec.DecodeError as exc:
                raise ConfigError(
                    f"{path}:{number}: {exc}; each line must be "
                    '{"env": NAME, "seed": INT, "actions": ["assistant message", ...]}'
                ) from None
            if not trajectory.actions:
                raise ConfigError(f"{path}:{number}: 'actions' is empty")
            found[trajectory.env].append(trajectory)
    return dict(found)


def hook_policy(env: Any) -> str | None:
    """The environment's own scripted policy, on the conversation it has seen so far."""
    return env.demonstrate(list(getattr(env, "history", [])))


def task_key(env: Any) -> str:
    """The identity of the environment's current task (as ``AgentEnv.draw_task`` splits)."""
    return env.task.key or repr(env.task.messages)


class ReplayPolicy:
    """Replays file trajectories: the actions of the current task, turn by turn."""

    def __init__(self, env_config: EnvironmentConfig, trajectories: list[Trajectory]) -> None:
        """Reset one environment at each trajectory's seed to learn its task's key."""
        from agentrl.registry import make

        env = make(env_config.id, **env_config.kwargs)
        self.actions: dict[str, list[str]] = {}
        for trajectory in trajectories:
            env.reset(seed=trajectory.seed)
            self.actions[task_key(env)] = trajectory.actions
        self.seeds = [t.seed for t in trajectories]
        env.close()

    def __call__(self, env: Any) -> str | None:
        """The next action of this task's trajectory; None past its end."""
        actions = self.actions.get(task_key(env), [])
        turn = sum(1 for m in env.history if m.role == "assistant")
        return actions[turn] if turn < len(actions) else None


def demonstration_policies(config: Config, trajectories: dict[str, list[Trajectory]] | None
                           = None) -> dict[str, Policy]:
    """Each environment's source of demonstrations; refuses an environment with none."""
    from agentrl.registry import make

    trajectories = trajectories or {}
    names = [e.display_name() for e in config.environments]
    unknown = sorted(set(trajectories) - set(names))
    if unknown:
        raise ConfigError(f"demonstrations name environment(s) {unknown} that the config does "
                          f"not have; its environments are {names} (the 'env' of each line)")
    policies: dict[str, Policy] = {}
    for env_config in config.environments:
        name = env_config.display_name()
        if name in trajectories:
            policies[name] = ReplayPolicy(env_config, trajectories[name])
            continue
        env = make(env_config.id, **env_config.kwargs)
        if not has_demonstration(env):
            raise ConfigError(missing_demonstrations_message(env_config))
        policies[name] = hook_policy
        env.close()
    return policies


def missing_demonstrations_message(env_config: EnvironmentConfig) -> str:
    """The refusal for an environment without demonstrations, naming both fixes."""
    name = env_config.display_name()
    return (
        f"environment {name!r} ({env_config.id}) has no demonstrations, so `agentrl sft` "
        "cannot warm-start on it (its weight's share would be missing). Either give its "
        "class a scripted policy, a method `def demonstrate(self, messages) -> str | None` "
        "returning the next assistant message, or pass `--demonstrations FILE.jsonl` with "
        f'lines {{"env": "{name}", "seed": 0, "actions": ["...", "..."]}} '
        "(docs/writing-environments.md, section Demonstrations)"
    )


# --------------------------------------------------------------------------- playing

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
    from agentrl.registry import make
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

"""Demonstrations: where each environment's correct episodes come from.

``agentrl sft`` warm-starts a model on them. They are *played*, not rendered:
``agentrl.rollout.demonstrations`` runs a scripted engine in place of the model inside the
ordinary rollout runner, so every demonstration row has exactly the token layout RL will
see (chat template, tool-response deltas, compaction), and its ``loss_mask`` marks what
the policy must learn.

Each environment of the config needs one source (checked before anything runs):

- its scripted policy, the ``AgentEnv.demonstrate(messages)`` hook; or
- trajectories from a JSONL file (``agentrl sft --demonstrations FILE``), one per line
  (the only source for an agent program's environment, a ``harness``: its actions are
  the replies to the program's requests, in order, and the program runs its own tools)::

      {"env": "logsearch", "seed": 3, "actions": ["<tool_call>...</tool_call>", "..."]}

  ``env``: the environment's name in the config (its ``name``, else the id's last part);
  ``seed``: the task seed (the task ``env.reset(seed=seed)`` draws); ``actions``: the
  main thread's assistant messages in order; ``threads`` (optional): each subagent
  thread's, by thread id (``{"1": ["...", "..."]}``, see ``agentrl.envs.subagents``).
  The tool results come from replaying the actions in the environment, and only
  trajectories the environment grades above 0 are trained on. A file's trajectories take
  precedence over the hook for the environments it names.

Each environment gets its weight's share of the demonstrations, and the count played and
correct per environment is reported; an environment none of whose demonstrations is
correct stops the warm start with the first failure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from agentrl.config import Config, ConfigError, EnvironmentConfig
from agentrl.envs.agent_env import has_demonstration
from agentrl.types import MAIN_THREAD

Policy = Callable[[Any, str], "str | None"]
"""A scripted policy: the environment (mid-episode) and a thread id ("main", or a
subagent's) → that thread's next assistant message."""


class Trajectory(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a demonstrations JSONL file."""

    env: str
    seed: int
    actions: list[str]
    threads: dict[str, list[str]] = {}
    """Subagent threads' actions, by thread id."""


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


def hook_policy(env: Any, thread_id: str = MAIN_THREAD) -> str | None:
    """The environment's own scripted policy, on the conversation the thread has seen so
    far (a subagent thread's own conversation, ``AgentEnv.thread_history``)."""
    return env.demonstrate(list(thread_messages(env, thread_id)))


def thread_messages(env: Any, thread_id: str) -> list[Any]:
    """The conversation of one thread as the environment saw it."""
    if thread_id == MAIN_THREAD:
        return list(getattr(env, "history", []))
    return list(env.thread_history(thread_id))


def task_key(env: Any) -> str:
    """The identity of the environment's current task (as ``AgentEnv.draw_task`` splits)."""
    return env.task.key or repr(env.task.messages)


class ReplayPolicy:
    """Replays file trajectories: the actions of the current task, turn by turn."""

    def __init__(self, env_config: EnvironmentConfig, trajectories: list[Trajectory]) -> None:
        """Reset one environment at each trajectory's seed to learn its task's key."""
        from agentrl.envs.registry import make

        env = make(env_config.id, **env_config.kwargs)
        self.actions: dict[str, dict[str, list[str]]] = {}
        for trajectory in trajectories:
            env.reset(seed=trajectory.seed)
            self.actions[task_key(env)] = {MAIN_THREAD: trajectory.actions,
                                           **trajectory.threads}
        self.seeds = [t.seed for t in trajectories]
        env.close()

    def __call__(self, env: Any, thread_id: str = MAIN_THREAD) -> str | None:
        """The next action of this task's trajectory in that thread; None past its end."""
        turn = sum(1 for m in thread_messages(env, thread_id) if m.role == "assistant")
        return self.action(env, thread_id, turn)

    def action(self, env: Any, thread_id: str, turn: int) -> str | None:
        """Action ``turn`` (0-based) of this task's trajectory in that thread; None past its
        end. An agent program's requests are counted by the engine instead of read from
        the environment's history (the program keeps the conversation)."""
        actions = self.actions.get(task_key(env), {}).get(thread_id, [])
        return actions[turn] if turn < len(actions) else None


def demonstration_policies(config: Config, trajectories: dict[str, list[Trajectory]] | None
                           = None) -> dict[str, Policy]:
    """Each environment's source of demonstrations; refuses an environment with none."""
    from agentrl.envs.registry import make

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
        if env_config.harness is not None:
            raise ConfigError(missing_harness_demonstrations_message(env_config))
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


def missing_harness_demonstrations_message(env_config: EnvironmentConfig) -> str:
    """The refusal for an agent program's environment without a JSONL of trajectories."""
    name = env_config.display_name()
    return (
        f"environment {name!r} is an agent program (harness): its demonstrations must come "
        f"from `--demonstrations FILE.jsonl` with lines "
        f'{{"env": "{name}", "seed": 0, "actions": ["...", "..."]}}, the replies to the '
        "program's requests in order; the environment's demonstrate() hook cannot play it, "
        "because the program, not the environment, keeps the conversation (docs/harnesses.md, "
        "section Warm start)"
    )

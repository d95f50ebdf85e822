"""Validation on held-out tasks: accuracy per environment, greedy, one rollout per task.

Held-out tasks are the environments' ``eval`` split (``reset(seed=i,
options={"split": "eval"})`` for ``i in range(n)``), which never shares a task with the
training split; the same ``n`` tasks are used at every validation, so the curve compares
like with like.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import msgspec

from agentrl.config import Config, EnvironmentConfig
from agentrl.types import Rollout


class EvalSplit:
    """An environment whose ``reset`` draws from the held-out split.

    Wrapping keeps the rollout code unaware of splits: it calls ``reset(seed=...)`` as in
    training and gets an eval task.
    """

    def __init__(self, env: Any) -> None:
        """Wrap one environment instance."""
        self.env = env

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        """``env.reset`` with ``options["split"] = "eval"``."""
        return self.env.reset(seed=seed, options={**(options or {}), "split": "eval"})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def is_correct(rollout: Rollout) -> float:
    """1.0 when the rollout solved its task: the verifier's ``correct`` component if it
    reports one, else a positive reward; invalid rollouts count as wrong."""
    if not rollout.valid:
        return 0.0
    if "correct" in rollout.reward_components:
        return float(rollout.reward_components["correct"] > 0)
    return float(rollout.reward > 0)


async def evaluate(
    engine: Any, tokenizer: Any, config: Config, num_tasks: int, temperature: float = 0.0
) -> dict[str, float]:
    """Accuracy of the engine's policy on ``num_tasks`` held-out tasks of each environment."""
    return accuracy_of(await evaluate_tasks(engine, tokenizer, config, num_tasks, temperature))


async def evaluate_tasks(
    engine: Any, tokenizer: Any, config: Config, num_tasks: int, temperature: float = 0.0
) -> dict[str, list[float]]:
    """Per environment, 1.0 or 0.0 for each of its ``num_tasks`` held-out tasks in order
    (task i is ``reset(seed=i, options={"split": "eval"})``): what paired comparisons
    between runs resample."""
    rollouts = await eval_rollouts(engine, tokenizer, config, num_tasks, temperature)
    outcomes: dict[str, list[float]] = {}
    for env in config.environments:
        name = env.display_name()
        outcomes[name] = [is_correct(r) for r in rollouts if r.env == name]
    return outcomes


def accuracy_of(outcomes: dict[str, list[float]]) -> dict[str, float]:
    """Mean correctness per environment (0.0 for an environment with no task)."""
    return {name: sum(v) / len(v) if v else 0.0 for name, v in outcomes.items()}


async def eval_rollouts(
    engine: Any, tokenizer: Any, config: Config, num_tasks: int, temperature: float = 0.0
) -> list[Rollout]:
    """One rollout per held-out task of every environment (greedy by default)."""
    from agentrl.rollout.chat_style import style_of
    from agentrl.rollout.episode import EnvSource, isolation_of, play_episode
    from agentrl.rollout.multi_turn import RolloutSpec

    rollout_cfg = msgspec.structs.replace(config.rollout, temperature=temperature)
    tool_format = style_of(tokenizer).tool_format
    limit = asyncio.Semaphore(config.rollout.max_concurrent_rollouts)
    endpoint = None
    if any(env.harness is not None for env in config.environments):
        from agentrl.rollout.harness_endpoint import HarnessEndpoint

        # a port of its own: during training the run's endpoint keeps endpoint.port
        own = msgspec.structs.replace(config.endpoint, port=0)
        endpoint = HarnessEndpoint(engine, tokenizer, rollout_cfg, own)

    async def one(env_config: EnvironmentConfig, index: int) -> Rollout:
        name = env_config.display_name()
        spec = RolloutSpec(rollout_id=f"eval-{name}-{index}", group_id=f"eval-{name}-{index}",
                           env=name, task_seed=index, sampling_seed=index)
        source = EnvSource(name, functools.partial(make_eval_env, env_config, tool_format),
                           isolation_of(env_config.id), env_config.harness)
        async with limit:  # a failing environment gives an invalid (wrong) rollout
            return await play_episode(spec, source, engine, tokenizer, rollout_cfg,
                                      config.compaction, endpoint=endpoint)

    try:
        return list(await asyncio.gather(*(
            one(env, i) for env in config.environments for i in range(num_tasks)
        )))
    finally:
        if endpoint is not None:
            await endpoint.close()


def make_env(env_config: EnvironmentConfig) -> Any:
    """An environment instance from its config entry."""
    from agentrl.envs.registry import make

    return make(env_config.id, **env_config.kwargs)


def make_eval_env(env_config: EnvironmentConfig, tool_format: str = "hermes") -> EvalSplit:
    """An instance whose ``reset`` draws held-out tasks, speaking the model's tool-call
    format (top-level: it pickles, for environments that run in a worker process)."""
    from agentrl.envs.parsers import adopt_tool_format

    return EvalSplit(adopt_tool_format(make_env(env_config), tool_format))

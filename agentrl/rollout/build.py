"""Building the rollout side of a run: engine replicas, sampler, runner, collector.

Used by the trainer's process and by the collector process alike
(``agentrl.rollout.collector_process``), so both assemble the same parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.config.accounting import plan_batches
from agentrl.engines.build import build_engines
from agentrl.parallel import groups
from agentrl.rollout.async_collector import AsyncCollector
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler


def build_engine(config: Config, model: Any, tokenizer: Any, model_dir: Path | str,
                 num_training_gpus: int = 1) -> Any:
    """The inference side: a router over the configured replicas (``agentrl.engines``),
    each loading ``model_dir`` itself (it never shares the trainer's parameters)."""
    return build_engines(config, model_dir, tokenizer, model.config.max_position_embeddings,
                         num_training_gpus=num_training_gpus)


def build_collector(config: Config, runner: Any, sampler: EnvironmentSampler,
                    first_step: int, resume: dict[str, Any] | None = None) -> Any:
    """The asynchronous collector producing steps ``first_step ..`` (max_staleness >= 1),
    continuing the carried-over groups of a checkpoint (``resume``: its sampler state's
    ``"carry_over"`` entry). Its thread syncs weights while the trainer trains: on a GPU
    the two take turns (``groups.one_communicator_at_a_time``)."""
    if torch.cuda.is_available():
        groups.share_gpu_between_threads()
    return AsyncCollector(runner, sampler, plan_batches(config).num_rollouts,
                          config.rollout.max_staleness, first_step, config.train.num_steps,
                          inflight_updates=config.rollout.inflight_updates,
                          carry_over=carries_over(config), resume=resume)


def carries_over(config: Config) -> bool:
    """Whether collections hand over before their slowest group (rollout.carry_over;
    not with dynamic sampling, which replaces groups within a collection, nor with
    train.deterministic, where which groups a step trains must not depend on timing)."""
    rollout = config.rollout
    return (rollout.max_staleness >= 1 and rollout.carry_over
            and not rollout.filter_uniform_groups and not config.train.deterministic)


def build_sampler(config: Config) -> EnvironmentSampler:
    """The environment sampler of a fresh run: the config's weights, its seed."""
    return EnvironmentSampler(
        {env.display_name(): env.weight for env in config.environments}, config.train.seed)


def build_runner(config: Config, engine: Any, tokenizer: Any,
                 sampler: EnvironmentSampler) -> Any:
    """The rollout runner over the configured environments."""
    return RolloutRunner(config, engine, tokenizer, sampler)

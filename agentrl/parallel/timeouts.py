"""How long ranks may wait: on a collective, and on rank 0's solo work.

Rank 0 alone generates, validates and writes checkpoints while ranks 1..N wait. Both
timeouts default to a bound derived from the config, so a long collection never aborts
a job (NCCL's own default is 10 minutes, shorter than one rollout's 600 s budget plus a
validation):

- a collection: ``rounds × waves × rollout.rollout_timeout_s``, where a wave is
  ``rollout.max_concurrent_rollouts`` rollouts (each bounded by the rollout timeout) and
  rounds count dynamic sampling's extra collections;
- a validation: its waves of held-out rollouts, each bounded the same way;
- plus ``CHECKPOINT_SLACK_S`` for writing a checkpoint.
"""

from __future__ import annotations

import math

import msgspec

from agentrl.config import Config

CHECKPOINT_SLACK_S = 1800.0
"""Seconds allowed for rank 0 to write one checkpoint (a 70B fp32 folder is ~280 GB)."""
MIN_COLLECTIVE_TIMEOUT_S = 1800.0
"""The derived collective timeout is never below this (30 minutes, 3x NCCL's default)."""


class Timeouts(msgspec.Struct, frozen=True):
    """Both waits of a run, in seconds."""

    collective_s: float
    """Any one collective (all-reduce, all-gather, broadcast)."""
    wait_for_rank0_s: float
    """Ranks 1..N waiting for rank 0's collection, validation or checkpoint."""


def rank0_budget_s(config: Config) -> float:
    """Upper bound of rank 0's solo work between two collectives, in seconds."""
    from agentrl.config.accounting import plan_batches

    rollout = config.rollout
    rounds = 1 + (rollout.max_extra_collections if rollout.filter_uniform_groups else 0)
    waves = math.ceil(plan_batches(config).num_rollouts / rollout.max_concurrent_rollouts)
    collection = rounds * waves * rollout.rollout_timeout_s
    validation = 0.0
    if config.train.eval_every:
        tasks = config.train.eval_tasks_per_env * len(config.environments)
        validation = math.ceil(tasks / rollout.max_concurrent_rollouts) * rollout.rollout_timeout_s
    return collection + validation + CHECKPOINT_SLACK_S


def timeouts(config: Config) -> Timeouts:
    """The configured timeouts, or the derived bound where a setting is None."""
    budget = rank0_budget_s(config)
    train = config.train
    collective = train.collective_timeout_s  # both > 0 and finite by their config ranges
    wait = train.wait_for_rank0_timeout_s
    return Timeouts(
        collective_s=collective if collective is not None else max(MIN_COLLECTIVE_TIMEOUT_S,
                                                                   budget),
        wait_for_rank0_s=wait if wait is not None else budget,
    )

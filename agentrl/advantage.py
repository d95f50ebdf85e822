"""Per-rollout advantages: one reward per rollout, a baseline within its group, broadcast.

The baseline sees each rollout once, however many rows compaction split it into:
group {g0: 1.0 in 4 rows, g1: 0.0 in 1 row} gives +0.5 / −0.5, never +0.2 / −0.8.
Groups are keyed by ``group_id``, never by position, so groups of different sizes
cannot be merged by a reshape. A rollout without rows (an agent program that answered
without asking the model) still counts in its group when the rollouts are given: it has
its reward and no tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from agentrl.reassembler import check_reward_copies, rollout_validity
from agentrl.types import Rollout, Row

STD_EPSILON = 1e-6
"""Added to the group's sample std (ddof=1) before dividing, with scale_by_std."""


class RolloutAdvantage(msgspec.Struct):
    """How one rollout's advantage came about (what `agentrl inspect` prints)."""

    rollout_id: str
    group_id: str
    reward: float
    baseline: float
    advantage: float
    valid: bool


Estimator = Callable[[np.ndarray, bool], tuple[np.ndarray, np.ndarray]]
"""rewards of a group's valid rollouts, scale_by_std → (baselines, advantages)."""


def _grpo(rewards: np.ndarray, scale_by_std: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mean baseline; with ``scale_by_std`` divided by the SAMPLE std (ddof=1) + 1e-6, as
    verl, NeMo-RL and TRL do, so their learning rates transfer. A group of one has no
    sample std: its advantage is 0 (it is also 0 without scaling)."""
    baseline = np.full_like(rewards, rewards.mean())
    advantages = rewards - baseline
    if scale_by_std:
        if len(rewards) < 2:
            return baseline, np.zeros_like(rewards)
        advantages = advantages / (rewards.std(ddof=1) + STD_EPSILON)
    return baseline, advantages


def _rloo(rewards: np.ndarray, scale_by_std: bool) -> tuple[np.ndarray, np.ndarray]:
    count = len(rewards)
    if count < 2:
        return rewards.copy(), np.zeros_like(rewards)
    baseline = (rewards.sum() - rewards) / (count - 1)
    return baseline, rewards - baseline


def _dr_grpo(rewards: np.ndarray, scale_by_std: bool) -> tuple[np.ndarray, np.ndarray]:
    baseline = np.full_like(rewards, rewards.mean())
    return baseline, rewards - baseline


ESTIMATORS: dict[str, Estimator] = {"grpo": _grpo, "rloo": _rloo, "dr_grpo": _dr_grpo}


def _estimator(name: str, scale_by_std: bool) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {list(ESTIMATORS)}")
    if scale_by_std and name != "grpo":
        raise ValueError(
            f"scale_by_std applies to the grpo estimator only; {name} never divides by the "
            "group std (set advantage.scale_by_std = false)"
        )
    return ESTIMATORS[name]


def rollout_advantages(
    rows: Sequence[Row], estimator: str = "grpo", scale_by_std: bool = False,
    rollouts: Sequence[Rollout] = (),
) -> dict[str, RolloutAdvantage]:
    """One advantage per rollout, after checking that the reward copies agree.

    ``rollouts``: the rollouts the rows came from; each of them is a member of its group
    even without a row (its own reward and validity then stand for the row copies)."""
    estimate = _estimator(estimator, scale_by_std)
    rewards = check_reward_copies(rows)
    valid = rollout_validity(rows)
    groups: dict[str, dict[str, None]] = defaultdict(dict)  # insertion-ordered sets
    for member in rollouts:
        if member.rollout_id not in rewards:  # no rows: nothing else carries its reward
            rewards[member.rollout_id] = member.reward
            valid[member.rollout_id] = member.trainable
        groups[member.group_id][member.rollout_id] = None
    for row in rows:
        groups[row.group_id][row.rollout_id] = None
    result: dict[str, RolloutAdvantage] = {}
    for group_id, members in groups.items():
        kept = [rid for rid in members if valid[rid]]
        values = np.array([rewards[rid] for rid in kept], dtype=np.float64)
        baselines, advantages = estimate(values, scale_by_std) if kept else ((), ())
        for rid, base, adv in zip(kept, baselines, advantages, strict=True):
            result[rid] = RolloutAdvantage(rid, group_id, rewards[rid], float(base), float(adv),
                                           True)
        for rid in members:
            if not valid[rid]:
                result[rid] = RolloutAdvantage(rid, group_id, rewards[rid], 0.0, 0.0, False)
    return result


def compute_advantages(
    rows: Sequence[Row], estimator: str = "grpo", scale_by_std: bool = False,
    rollouts: Sequence[Rollout] = (),
) -> list[float]:
    """One advantage per row, in input order: its rollout's advantage, broadcast.

    Rows of invalid rollouts get 0; the loss also excludes them from its token count.
    A group whose valid rewards are all equal gives 0 everywhere. ``rollouts``: as for
    :func:`rollout_advantages` (a rollout without rows counts in its group's baseline).
    """
    per_rollout = rollout_advantages(rows, estimator, scale_by_std, rollouts)
    return [per_rollout[row.rollout_id].advantage for row in rows]

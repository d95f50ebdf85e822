"""Rollouts → rows: the rollout's one reward is copied onto every row it was split into.

Compaction cuts a long rollout into several segments, and a rollout may hold several
threads (subagents), each with segments of its own; every segment becomes a trainable row.
The copies of the reward must agree and a rollout is only as valid as its worst row;
``check_reward_copies`` and ``rollout_validity`` state those two rules for any list of rows.

With ``loss.summary_tokens = "mask"`` the compaction summary a row ends with (its
segment's ``num_summary_tokens``) gets loss mask 0: no gradient flows through it, and the
update's token count N (invariant 4) counts only the tokens that are trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agentrl.types import Rollout, Row, Segment

SUMMARY_TOKENS = ("train", "mask")
"""What ``loss.summary_tokens`` may say: train the compaction summaries, or mask them."""


class RewardMismatchError(ValueError):
    """The reward copies of one rollout disagree: training on them would be wrong."""


def to_rows(rollouts: Iterable[Rollout], summary_tokens: str = "train") -> list[Row]:
    """One row per segment, each carrying its rollout's reward and validity;
    ``summary_tokens = "mask"``: each row's compaction summary untrained."""
    if summary_tokens not in SUMMARY_TOKENS:
        raise ValueError(f'loss.summary_tokens = "{summary_tokens}"; choose "train" or "mask"')
    rows = []
    for rollout in rollouts:
        valid = rollout.trainable
        for index, segment in enumerate(rollout.segments):
            loss_mask, logprobs = segment.loss_mask, segment.logprobs
            if summary_tokens == "mask" and segment.num_summary_tokens:
                loss_mask, logprobs = masked_summary(segment)
            rows.append(
                Row(
                    rollout_id=rollout.rollout_id,
                    group_id=rollout.group_id,
                    env=rollout.env,
                    segment=index,
                    token_ids=segment.token_ids,
                    loss_mask=loss_mask,
                    logprobs=logprobs,
                    reward=rollout.reward,
                    valid=valid,
                    num_prompt_tokens=segment.num_prompt_tokens,
                    version_runs=segment.version_runs,
                    thread=segment.thread,
                )
            )
    return rows


def masked_summary(segment: Segment) -> tuple[list[int], list[float]]:
    """The segment's loss mask and log-probs with its last ``num_summary_tokens``
    generated tokens (the summary it ends with) set to 0, as for any untrained token."""
    loss_mask, logprobs = list(segment.loss_mask), list(segment.logprobs)
    left = segment.num_summary_tokens
    for i in range(len(loss_mask) - 1, -1, -1):
        if not left:
            break
        if loss_mask[i]:
            loss_mask[i], logprobs[i], left = 0, 0.0, left - 1
    return loss_mask, logprobs


def num_trained_tokens(rollout: Rollout, summary_tokens: str = "train") -> int:
    """Generated tokens of ``rollout`` that rows built by :func:`to_rows` train."""
    masked = summary_tokens == "mask"
    return sum(s.num_generated_tokens - (s.num_summary_tokens if masked else 0)
               for s in rollout.segments)


def check_reward_copies(rows: Sequence[Row]) -> dict[str, float]:
    """The one reward of each rollout; raises RewardMismatchError when copies disagree.

    Also refuses a rollout whose rows name different groups or environments, since
    the baseline would then be computed in the wrong place.
    """
    rewards: dict[str, float] = {}
    owner: dict[str, tuple[str, str]] = {}
    for row in rows:
        seen = rewards.setdefault(row.rollout_id, row.reward)
        if seen != row.reward:
            values = sorted({r.reward for r in rows if r.rollout_id == row.rollout_id})
            raise RewardMismatchError(
                f"rollout {row.rollout_id!r} has rows with different rewards {values}; every "
                "row of a rollout must carry the same copy of its one reward (a compaction "
                "or reassembly bug upstream) — refusing to train on this batch"
            )
        place = owner.setdefault(row.rollout_id, (row.group_id, row.env))
        if place != (row.group_id, row.env):
            raise ValueError(
                f"rollout {row.rollout_id!r} has rows in group/env {place} and "
                f"{(row.group_id, row.env)}; a rollout belongs to exactly one group"
            )
    return rewards


def rollout_validity(rows: Sequence[Row]) -> dict[str, bool]:
    """Validity of each rollout: the minimum over its rows (one bad row masks it all)."""
    valid: dict[str, bool] = {}
    for row in rows:
        valid[row.rollout_id] = valid.get(row.rollout_id, True) and row.valid
    return valid

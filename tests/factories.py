"""Small builders of rollouts and rows for tests (no model needed)."""

from __future__ import annotations

from agentrl.types import Rollout, Segment


def segment(num_prompt: int = 3, num_generated: int = 2) -> Segment:
    """A segment with ``num_prompt`` prompt tokens followed by ``num_generated`` generated ones."""
    tokens = list(range(num_prompt + num_generated))
    mask = [0] * num_prompt + [1] * num_generated
    return Segment(tokens, mask, [-0.5 * m for m in mask], num_prompt)


def rollout(
    rid: str, group: str, reward: float, num_rows: int = 1, env: str = "e", valid: bool = True,
    num_generated: int = 2,
) -> Rollout:
    """A rollout split into ``num_rows`` segments, as compaction would split it."""
    segments = [segment(num_generated=num_generated) for _ in range(num_rows)]
    return Rollout(rid, group, env, segments, reward, valid)

"""Accumulating one segment's tokens as the engine sees them."""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.staleness import extend_runs
from agentrl.types import Segment


class SegmentBuilder:
    """A segment under construction: a prompt, then generated and observation tokens."""

    def __init__(self, prompt_ids: list[int]) -> None:
        """Start from exactly the ids the engine will receive as this segment's prompt."""
        self.token_ids = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.version_runs: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def add_generated(self, token_ids: list[int], logprobs: list[float],
                      versions: Sequence[int] = ()) -> None:
        """Append the policy's tokens (trained: loss_mask 1) with their behaviour log-probs
        and the policy version of each token (none given: versions stay unrecorded)."""
        if len(token_ids) != len(logprobs):
            raise ValueError(
                f"engine returned {len(token_ids)} tokens but {len(logprobs)} log-probs"
            )
        if versions and len(versions) != len(token_ids):
            raise ValueError(
                f"engine returned {len(token_ids)} tokens but {len(versions)} versions"
            )
        extend_runs(self.version_runs, len(self.token_ids), versions)
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(logprobs)

    def add_observation(self, token_ids: list[int]) -> None:
        """Append tokens the environment or template added (not trained: loss_mask 0)."""
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def build(self) -> Segment:
        """The finished segment (copies, so the builder may keep growing)."""
        return Segment(list(self.token_ids), list(self.loss_mask), list(self.logprobs),
                       self.num_prompt_tokens, version_runs=list(self.version_runs))

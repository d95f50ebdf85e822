"""The one interface every inference engine serves: token ids in, token ids out.

Multi-turn contexts are built by appending token ids, never by re-tokenizing text that
was already tokenized; so an engine never sees text, only ids.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample one completion."""

    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    max_tokens: int = 256
    """Generated tokens at most."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after emitting one of these (it is included in the output)."""
    stop: tuple[str, ...] = ()
    """Generation ends once the decoded output contains one of these strings."""
    seed: int | None = None


class Generation(msgspec.Struct):
    """One completion: the sampled ids, their log-probs under the engine, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token under the engine's (unmodified) distribution."""
    finish_reason: Literal["stop", "length"]
    versions: list[int] = []
    """Policy version of each sampled token, from engines that swap weights between
    decode steps (in-flight updates); empty: every token came from the engine's
    ``weight_version`` when the call returned."""


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine that many rollouts call concurrently from one asyncio loop."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Complete one prompt."""
        ...

    def update_weights(self, state_dict: dict) -> None:
        """Load new policy weights in place; raises when the sync fails, never hangs."""
        ...

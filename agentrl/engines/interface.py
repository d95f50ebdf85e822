"""The one interface every inference engine serves: token ids in, token ids out.

Multi-turn contexts are built by appending token ids, never by re-tokenizing text that
was already tokenized; so an engine never sees text, only ids.

Weights move in as ``(Hugging Face name, full tensor)`` pairs produced one at a time
(:data:`NamedTensors`): a trainer whose parameters are sharded materialises one parameter
(or one bucket) at a time and never holds the whole model gathered. A plain state dict is
accepted too (its ``.items()`` are such pairs). Every engine reports the version of the
weights it serves (``weight_version``), bumped by each successful sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Literal, Protocol, runtime_checkable

import msgspec
import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
"""What ``update_weights`` takes: (HF name, full tensor) pairs, or a state dict."""


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


class WeightSyncError(RuntimeError):
    """An engine (replica) did not confirm a weight update: it failed or timed out. The
    message names the replica; its weights are then undefined until the next sync."""


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine that many rollouts call concurrently from one asyncio loop."""

    weight_version: int
    """Version of the weights served: 0 at start, the version of the last successful sync."""

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Generation:
        """Complete one prompt. ``key`` names the rollout the request belongs to: engines
        with several replicas keep one key on one replica (its prefix cache); others
        ignore it."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None) -> None:
        """Load new policy weights in place (HF names; all of them, once each) and serve
        them as ``version`` (default: the current version + 1); raises
        :class:`WeightSyncError` when the sync fails or times out, never hangs."""
        ...


def named_pairs(named_tensors: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of a state dict or of an iterable of pairs, lazily."""
    if isinstance(named_tensors, Mapping):
        yield from named_tensors.items()
    else:
        yield from named_tensors


def next_version(current: int, version: int | None) -> int:
    """The version a sync installs: the one given, else one past the current one."""
    return current + 1 if version is None else int(version)

"""The built-in engine's per-slot state as tensors, and which slot holds which prefix.

Decoding keeps everything a step needs in tensors indexed by slot (the token to feed,
tokens generated, the limit, temperature, top-p, stop ids, each request's random numbers
and its output so far), so one decode step is a fixed number of tensor operations
whatever the number of requests: no per-token Python work. Python touches a request when
it is admitted and when it finishes.

Prefix reuse: a slot remembers the tokens whose keys/values it holds. A finished slot
stays *idle* (not free) until another request needs the room, least recently used first:

- a request whose prompt equals a prompt already prefilled (the other rollouts of a
  group start from the same prompt) copies that slot's keys/values and its last-position
  logits: no forward at all, and the same bits a prefill of its own would give;
- a request that continues an idle slot's conversation (the same ``key``: the next turn
  of a multi-turn rollout, or a compacted context keeping the head) takes that slot over
  and prefills only the tokens past the common prefix;
- a request whose prompt shares at least ``MIN_SHARED_PREFIX`` first tokens with a prompt
  prefilled in some slot (every task of an environment starts with the same system
  prompt and tool list) copies those positions and prefills only the rest.

Either reuse needs the slot's keys/values to come from the weights the new request runs
under: each slot remembers the version its cache was computed under (``cached_under``,
an adapter version in a LoRA engine, else the weight version), and a request of another
version never reuses it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch

LOGIT_SLOTS_LIMIT_BYTES = 256 * 2**20
"""Stored last-position logits (for identical prompts) are dropped past this size."""
Candidate = TypeVar("Candidate")
MIN_SHARED_PREFIX = 16
"""First tokens two different prompts must share for the second to copy the first's
keys/values instead of computing them (shorter shared heads are not worth a copy)."""


class SlotTable:
    """Per-slot decode state [num_slots, ...] and the prefix bookkeeping (module doc)."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        """Every slot free; tensors on ``device`` (the model's)."""
        self.num_slots, self.device = num_slots, device
        long = {"dtype": torch.long, "device": device}
        self.last_token = torch.zeros(num_slots, **long)
        """The token each slot feeds at the next decode step (its last sampled one)."""
        self.count = torch.zeros(num_slots, **long)
        """Tokens generated so far."""
        self.limit = torch.ones(num_slots, **long)
        """max_tokens of the slot's request."""
        self.running = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.temperature = torch.zeros(num_slots, device=device)
        self.top_p = torch.ones(num_slots, device=device)
        self.stop_ids = torch.full((num_slots, 1), -1, **long)
        self.uniform = torch.zeros(num_slots, 1, device=device)
        """The request's random numbers, one per token it may generate."""
        self.out_tokens = torch.zeros(num_slots, 1, **long)
        self.out_logprobs = torch.zeros(num_slots, 1, device=device)
        self.out_versions = torch.zeros(num_slots, 1, **long)
        self.version = torch.zeros(num_slots, **long)
        """The version each slot's next token records."""
        self.cached_under: list[int | None] = [None] * num_slots
        """The version whose weights computed slot i's cached keys/values."""
        self.tokens: list[list[int] | None] = [None] * num_slots
        """Token ids whose keys/values slot i holds (None: nothing reusable)."""
        self.idle: OrderedDict[int, str | None] = OrderedDict()
        """Finished slots still holding their tokens, oldest first, with their key."""
        self.prompt_slot: dict[tuple[int, ...], int] = {}
        """A prompt whose prefill is in a slot (its first len(prompt) positions)."""
        self.prompt_logits: dict[int, torch.Tensor] = {}
        """Last-position logits of the prompt prefilled in slot i."""
        self.busy: set[int] = set()
        """Slots of admitted, unfinished requests."""

    # ------------------------------------------------------------------ slots

    def take_slot(self, keep: int | None = None) -> int | None:
        """A slot for a new request: the lowest free one, else the least recently used
        idle one (its contents dropped); never ``keep``. None when all are busy."""
        for slot in range(self.num_slots):
            if slot not in self.busy and slot not in self.idle and slot != keep:
                return self.claim(slot)
        for slot in self.idle:
            if slot != keep:
                return self.claim(slot)
        return None

    def claim(self, slot: int) -> int:
        """Mark ``slot`` busy for a new request and forget what it held."""
        self.forget(slot)
        self.busy.add(slot)
        return slot

    def forget(self, slot: int) -> None:
        """Drop what ``slot`` held from the prefix bookkeeping."""
        self.idle.pop(slot, None)
        self.tokens[slot] = None
        self.cached_under[slot] = None
        self.prompt_logits.pop(slot, None)
        for prompt in [p for p, s in self.prompt_slot.items() if s == slot]:
            del self.prompt_slot[prompt]

    def release(self, slot: int, key: str | None, tokens: list[int] | None) -> None:
        """A request finished: its slot goes idle, holding ``tokens`` for reuse."""
        self.busy.discard(slot)
        self.running[slot] = False
        self.tokens[slot] = tokens
        self.idle[slot] = key
        self.idle.move_to_end(slot)

    def move(self, source: int, target: int) -> None:
        """A running request moves from ``source`` to the claimed slot ``target`` (its
        cache already copied): its rows follow it and ``source`` becomes free."""
        for name in ("last_token", "count", "limit", "running", "temperature", "top_p",
                     "stop_ids", "uniform", "out_tokens", "out_logprobs", "out_versions",
                     "version"):
            table = getattr(self, name)
            table[target] = table[source]
        self.cached_under[target] = self.cached_under[source]
        self.running[source] = False
        self.busy.discard(source)
        self.forget(source)

    def prompt_source(self, prompt: list[int], version: int) -> int | None:
        """The slot holding the prefill of ``prompt`` under ``version``, with its logits."""
        source = self.prompt_slot.get(tuple(prompt))
        if source is None or source not in self.prompt_logits:
            return None
        return source if self.cached_under[source] == version else None

    def continuation_of(self, key: str | None, prompt: list[int], version: int
                        ) -> tuple[int, int] | None:
        """(idle slot, tokens reusable) for the idle slot with ``key``, cached under
        ``version``, sharing the longest prefix with ``prompt`` (a key can own several
        idle slots); at least one prompt token is left to prefill (its logits)."""
        if key is None:
            return None
        best, common = None, 0
        for slot, slot_key in self.idle.items():
            held = self.tokens[slot]
            if (slot_key == key and held and self.cached_under[slot] == version
                    and (length := common_prefix(held, prompt)) > common):
                best, common = slot, length
        return None if best is None else (best, min(common, len(prompt) - 1))

    def shared_prompt(self, prompt: tuple[int, ...], version: int) -> tuple[int, int] | None:
        """(slot, positions) for the slot holding a prefilled prompt under ``version`` that
        shares the longest head with ``prompt`` (:func:`longest_shared_head`)."""
        return longest_shared_head(prompt, ((held, slot) for held, slot in
                                            self.prompt_slot.items()
                                            if self.cached_under[slot] == version))

    def set_version(self, version: int, slots: list[int] | None = None) -> None:
        """From now on ``slots`` (every slot for None) record ``version`` for their tokens
        (an in-flight sync); what their cache holds stays as it was computed."""
        with torch.inference_mode():  # the table's tensors were made in inference mode
            self.version[slice(None) if slots is None else slots] = version

    def remember_prompt(self, slot: int, prompt: list[int], logits: torch.Tensor,
                        version: int) -> None:
        """``slot`` holds the prefill of ``prompt`` under ``version``, whose last position
        gave ``logits``."""
        self.cached_under[slot] = version
        stored = sum(t.numel() * t.element_size() for t in self.prompt_logits.values())
        if stored + logits.numel() * logits.element_size() > LOGIT_SLOTS_LIMIT_BYTES:
            return
        self.prompt_slot[tuple(prompt)] = slot
        self.prompt_logits[slot] = logits

    def clear_prefixes(self) -> None:
        """Forget every reusable prefix (new weights: the cached keys/values are stale)."""
        for slot in list(self.idle):
            self.forget(slot)
        self.prompt_slot.clear()
        self.prompt_logits.clear()
        for slot in range(self.num_slots):
            if slot not in self.busy:
                self.tokens[slot] = None
                self.cached_under[slot] = None

    # ------------------------------------------------------------------ requests

    def start(self, slot: int, request: Any, version: int) -> None:
        """Load a newly admitted request's settings into its slot's row; its prompt's
        cache was computed under ``version``, and its tokens record it."""
        params = request.params
        self._fit(request.max_tokens, len(params.stop_token_ids))
        self.count[slot] = 0
        self.limit[slot] = request.max_tokens
        self.temperature[slot] = params.temperature
        self.top_p[slot] = params.top_p
        self.stop_ids[slot] = -1
        if params.stop_token_ids:
            self.stop_ids[slot, :len(params.stop_token_ids)] = torch.tensor(
                params.stop_token_ids, device=self.device)
        if params.temperature > 0:
            draws = torch.rand(request.max_tokens, generator=request.generator)
            self.uniform[slot, :request.max_tokens] = draws.to(self.device)
        self.version[slot] = version
        self.cached_under[slot] = version
        self.running[slot] = True

    def _fit(self, max_tokens: int, num_stop_ids: int) -> None:
        """Widen the per-token tables to ``max_tokens`` and the stop table to
        ``num_stop_ids`` columns."""
        width = self.out_tokens.shape[1]
        if max_tokens > width:
            extra = max(max_tokens, 2 * width) - width
            self.uniform = _widen(self.uniform, extra, 0.0)
            self.out_tokens = _widen(self.out_tokens, extra, 0)
            self.out_logprobs = _widen(self.out_logprobs, extra, 0.0)
            self.out_versions = _widen(self.out_versions, extra, 0)
        if num_stop_ids > self.stop_ids.shape[1]:
            self.stop_ids = _widen(self.stop_ids, num_stop_ids - self.stop_ids.shape[1], -1)

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor
               ) -> torch.Tensor:
        """Append each slot in ``rows``'s new token with its slot's version; returns which
        of them finished (a stop id, or max_tokens reached)."""
        at = self.count[rows]
        self.out_tokens[rows, at] = tokens
        self.out_logprobs[rows, at] = logprobs
        self.out_versions[rows, at] = self.version[rows]
        self.count[rows] = at + 1
        self.last_token[rows] = tokens
        stopped = (self.stop_ids[rows] == tokens[:, None]).any(dim=-1)
        return stopped | (at + 1 >= self.limit[rows])

    def output(self, slot: int) -> tuple[list[int], list[float], list[int]]:
        """The slot's generated tokens, their log-probs and versions, as lists."""
        n = int(self.count[slot])
        return (self.out_tokens[slot, :n].tolist(), self.out_logprobs[slot, :n].tolist(),
                self.out_versions[slot, :n].tolist())

    def uniforms(self, rows: torch.Tensor) -> torch.Tensor:
        """Each row's random number for the token it samples next."""
        at = self.count[rows].clamp(max=self.uniform.shape[1] - 1)
        return self.uniform[rows, at]


def _widen(table: torch.Tensor, extra: int, fill: float) -> torch.Tensor:
    pad = torch.full((table.shape[0], extra), fill, dtype=table.dtype, device=table.device)
    return torch.cat([table, pad], dim=1)


def longest_shared_head(prompt: tuple[int, ...],
                        candidates: Iterable[tuple[tuple[int, ...], Candidate]]
                        ) -> tuple[Candidate, int] | None:
    """(candidate, positions) for the (tokens, candidate) pair whose tokens share the most
    first tokens with ``prompt``, at least ``MIN_SHARED_PREFIX``, else None; at least one
    token of ``prompt`` is left to compute (its logits)."""
    best, common = None, MIN_SHARED_PREFIX - 1
    head = prompt[:MIN_SHARED_PREFIX]
    for tokens, candidate in candidates:
        if tokens[:MIN_SHARED_PREFIX] == head and (
                length := common_prefix(tokens, prompt)) > common:
            best, common = candidate, length
    return None if best is None else (best, min(common, len(prompt) - 1))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens ``a`` and ``b`` share; compared in slices (C speed), as
    prompts share hundreds of tokens and are compared at every admission."""
    if type(a) is not type(b):
        a, b = tuple(a), tuple(b)
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low

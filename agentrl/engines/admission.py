"""How the torch engine admits requests: each one's cache slot, and how its prompt's KV
cache is made (copied from a slot holding the same prompt, continued from its rollout's
idle slot, its head copied from a prompt that starts the same way, or prefilled, several
prompts right-padded into one forward)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engines.interface import SamplingParams
from agentrl.engines.slot_table import SlotTable, longest_shared_head

PREFILL_TOKENS = 4096
"""Padded tokens one batched prefill forward holds at most (rows × longest new part)."""


@dataclass
class Request:
    """One ``generate`` call: its prompt, sampling and random numbers, and its slot."""

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    generator: torch.Generator
    max_tokens: int
    key: str | None = None
    slot: int = -1
    version: int = 0
    """The weights it runs under (a LoRA engine: its adapter version), set on admission."""
    shared_head: int = 0
    """First positions copied from another prompt's cache on admission (its prefill then
    covers the rest, and the whole prompt is remembered for identical ones)."""


@dataclass
class Admission:
    """Admitted requests of one admission round, by how their prompt gets its cache."""

    compute: list[tuple[Request, int]] = field(default_factory=list)
    """(request, positions already cached in its slot): a forward over the rest."""
    copied: list[tuple[Request, torch.Tensor]] = field(default_factory=list)
    """(request, last-position logits): its prompt was copied from another slot."""
    followers: list[tuple[Request, Request]] = field(default_factory=list)
    """(request, the request of this round whose identical prompt it copies)."""
    second: list[tuple[Request, Request]] = field(default_factory=list)
    """(request, the request of this round whose prompt starts like its own): it copies
    that prompt's head once the first forwards computed it, then prefills the rest."""


def plan_admission(admitted: list[Request], cache: Any, table: SlotTable,
                   batch_invariant: bool) -> Admission:
    """Choose each request's slot and how its prompt's cache is made; a prompt some slot
    already holds is copied now. Only a cache computed under the request's version is
    reused. Batch invariant: never continue a conversation from a slot (a partial prefill
    rounds differently from a whole one)."""
    plan = Admission()
    leaders: dict[tuple[int, tuple[int, ...]], Request] = {}
    for request in admitted:
        prompt = (request.version, tuple(request.prompt_ids))
        source = table.prompt_source(request.prompt_ids, request.version)
        if source is not None:
            logits = table.prompt_logits[source]
            request.slot = _take(table, keep=source, fallback=source)
            cache.copy_prefix(source, request.slot, len(request.prompt_ids))
            table.remember_prompt(request.slot, request.prompt_ids, logits, request.version)
            plan.copied.append((request, logits))
        elif prompt in leaders:
            request.slot = _take(table)
            plan.followers.append((request, leaders[prompt]))
        elif not batch_invariant and (found := table.continuation_of(
                request.key, request.prompt_ids, request.version)):
            request.slot, reused = table.claim(found[0]), found[1]
            cache.set_length(request.slot, reused)
            plan.compute.append((request, reused))
        else:
            leaders[prompt] = request
            _fresh(request, plan, cache, table, batch_invariant)
    return plan


def _fresh(request: Request, plan: Admission, cache: Any, table: SlotTable,
           batch_invariant: bool) -> None:
    """A prompt no slot holds: copy the longest head it shares with a prompt some slot
    holds, or will hold after this round's first forwards; prefill the rest. Batch
    invariant: prefill it whole (a partial prefill rounds differently)."""
    prompt = tuple(request.prompt_ids)
    held = None if batch_invariant else table.shared_prompt(prompt, request.version)
    first = None if batch_invariant else _sharing_leader(prompt, request.version, plan)
    if first is not None and (held is None or first[1] > held[1]):
        request.slot, request.shared_head = _take(table), first[1]
        plan.second.append((request, first[0]))
    elif held is not None:
        source, request.shared_head = held
        request.slot = _take(table, keep=source, fallback=source)  # none free: the source
        cache.copy_prefix(source, request.slot, request.shared_head)
        plan.compute.append((request, request.shared_head))
    else:
        request.slot = _take(table)
        cache.set_length(request.slot, 0)
        plan.compute.append((request, 0))


def _sharing_leader(prompt: tuple[int, ...], version: int, plan: Admission
                    ) -> tuple[Request, int] | None:
    """The request whose prompt this round's first forwards complete (under ``version``)
    sharing the longest head with ``prompt`` (:func:`longest_shared_head`)."""
    return longest_shared_head(prompt, ((tuple(r.prompt_ids), r) for r, _ in plan.compute
                                        if r.version == version))


def _take(table: SlotTable, keep: int | None = None, fallback: int | None = None) -> int:
    """A slot for an admitted request, never ``keep``, unless no other is left and
    ``fallback`` (the idle slot holding its prompt) can be taken over."""
    slot = table.take_slot(keep)
    if slot is None and fallback is not None and fallback not in table.busy:
        slot = table.claim(fallback)
    assert slot is not None, "admission takes at most as many requests as free slots"
    return slot


def prefill_batches(compute: list[tuple[Request, int]], batch_invariant: bool
                    ) -> list[list[tuple[Request, int]]]:
    """The prompts to prefill, grouped into forwards of at most PREFILL_TOKENS padded
    tokens; one prompt per forward when batch invariant."""
    batches: list[list[tuple[Request, int]]] = []
    batch: list[tuple[Request, int]] = []
    for item in compute:
        width = max([len(r.prompt_ids) - start for r, start in [*batch, item]])
        if batch and (batch_invariant or width * (len(batch) + 1) > PREFILL_TOKENS):
            batches.append(batch)
            batch = []
        batch.append(item)
    return batches + [batch] if batch else batches


def prefill(model: Any, batch: list[tuple[Request, int]], cache: Any, table: SlotTable
            ) -> list[tuple[Request, torch.Tensor]]:
    """One forward over the uncached part of each prompt of ``batch`` (right-padded);
    returns each request's last-position logits and remembers whole prompts' logits for
    identical prompts admitted later."""
    device = cache.lengths.device
    parts = [r.prompt_ids[start:] for r, start in batch]
    width = max(len(p) for p in parts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in parts], device=device)
    slots = torch.tensor([r.slot for r, _ in batch], device=device)
    counts = torch.tensor([len(p) for p in parts], device=device)
    logits = model.forward_cached(ids, slots, cache, num_new=counts, last_only=True)
    for (request, start), row in zip(batch, logits, strict=True):
        if start == request.shared_head:  # the whole prompt under its version, not a turn
            table.remember_prompt(request.slot, request.prompt_ids, row, request.version)
    return [(request, row) for (request, _), row in zip(batch, logits, strict=True)]

"""Batched decode attention that reads a group's shared prompt once (cascade attention).

The engine gives every sample of a group its own slot holding a copy of the prompt's keys
and values (:meth:`KVCache.copy_prefix`). Decoding one token for every slot then reads
each copy: a group of 8 samples reads its prompt 8 times per layer per token, and that
read is what bounds one-query attention on a CPU (memory bandwidth, not arithmetic).

Here the first ``length`` positions, which every grouped row holds as a copy of its
group's, are read from one member per group: the queries of all members are stacked
against that member's keys, and only the positions after it are read per row. The
scores are laid back in each row's own order before the softmax, so the result is the
same attention as reading every slot in full (to float rounding of the matmuls).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SAVED_BYTES = 8 << 20
"""Keys and values one layer's attention must skip reading for the extra steps to pay
(measured on a 2-core CPU: the quickstart model's 3.6 MB a layer, held in the CPU's
caches, made decoding 12% slower; an 8-layer, 512-hidden model's 15 MB at 64-token prompts
made it 5 to 8% faster, and 7 MB at 32-token ones 2%)."""


@dataclass(frozen=True)
class PrefixPlan:
    """How one decode forward reads shared prompts: rows are the forward's rows."""

    length: int
    """Positions [0, length) read once per group (every grouped row holds them)."""
    sources: torch.Tensor
    """[G] the row whose cache each group's shared positions are read from."""
    members: torch.Tensor
    """[G, M] each group's rows, padded by repeating its first."""
    place: torch.Tensor
    """[N] each row's place in the flattened [G * M] (rows with no new token: 0; their
    output is not used)."""
    in_order: bool = False
    """The rows are the groups one after another, all of one size: members and place
    are plain reshapes (no gather)."""


def plan_prefixes(slots: list[int], running: list[bool], group_of: list[int],
                  shared: list[int], device: torch.device, position_bytes: int,
                  min_saved: int | None = None) -> PrefixPlan | None:
    """The plan for decoding rows holding ``slots`` (``running``: the rows that decode a
    token) from a cache whose slots record ``group_of`` and ``shared`` (its
    ``prefix_group`` and ``prefix_len``) and whose keys and values take ``position_bytes``
    a position and layer; None where it would not pay: no two running rows share a
    group, fewer than two running rows per group read, or under ``min_saved`` bytes a
    layer left unread (default :data:`MIN_SAVED_BYTES`)."""
    groups: dict[int, list[int]] = {}
    for row, (slot, runs) in enumerate(zip(slots, running, strict=True)):
        if runs:  # an ungrouped row reads its own positions: a group of one
            key = group_of[slot] if group_of[slot] >= 0 else -1 - row
            groups.setdefault(key, []).append(row)
    grouped = [rows for rows in groups.values() if len(rows) > 1]
    if not grouped or 2 * len(groups) > sum(map(len, groups.values())):
        return None
    length = min(shared[slots[row]] for rows in grouped for row in rows)
    skipped = sum(len(rows) - 1 for rows in groups.values())
    least = MIN_SAVED_BYTES if min_saved is None else min_saved
    if length == 0 or skipped * length * position_bytes < least:
        return None
    layout = list(groups.values())
    runs = _in_runs(_seat_idle_rows(groups, slots, running, group_of))
    seated = [rows for _, rows in runs]
    if _consecutive(seated, len(slots)) and all(
            _may_lead(key, rows, slots, running, group_of, shared, length)
            for key, rows in runs):
        layout = seated
    width = max(map(len, layout))
    members = [rows + rows[:1] * (width - len(rows)) for rows in layout]
    place = [0] * len(slots)
    for g, rows in enumerate(layout):
        for j, row in enumerate(rows):
            place[row] = g * width + j
    return PrefixPlan(length, torch.tensor([rows[0] for rows in members], device=device),
                      torch.tensor(members, device=device), torch.tensor(place, device=device),
                      in_order=_consecutive(layout, len(slots)))


def _may_lead(key: int, rows: list[int], slots: list[int], running: list[bool],
              group_of: list[int], shared: list[int], length: int) -> bool:
    """Whether a run's first row may be the one its running rows read the first
    ``length`` positions from: it is the run's only running row (reading its own), or it
    and every running row hold group ``key``'s copy of them (a group of one running row,
    seated beside idle rows, may share fewer positions with its group than ``length``)."""
    readers = [row for row in rows if running[row]]
    if readers == rows[:1]:
        return True
    return key >= 0 and all(group_of[slots[row]] == key and shared[slots[row]] >= length
                            for row in {rows[0], *readers})


def _seat_idle_rows(groups: dict[int, list[int]], slots: list[int], running: list[bool],
                    group_of: list[int]) -> dict[int, list[int]]:
    """``groups`` with every row that decodes no token seated in one, in row order: its
    own slot's group where that group runs, else the group of the row before it (or the
    first group). Such a row's output is never used, so any seat is correct; seated, a
    batch whose groups sit in consecutive rows stays reshaped, not gathered, after some
    of its rows finish (measured: 128 rows of 16 groups decoding 40 tokens, 1.93 s
    gathered against 1.80 s reshaped; 8 layers, hidden 512, 2 threads)."""
    seated = {key: list(rows) for key, rows in groups.items()}
    previous = next(iter(groups))
    for row, (slot, runs) in enumerate(zip(slots, running, strict=True)):
        if runs:
            previous = group_of[slot] if group_of[slot] >= 0 else -1 - row
            continue
        own = group_of[slot]
        previous = own if own >= 0 and own in seated else previous
        seated[previous].append(row)
    for rows in seated.values():
        rows.sort()
    return seated


def _in_runs(groups: dict[int, list[int]]) -> list[tuple[int, list[int]]]:
    """Each group's key and rows, cut into runs of the smallest group's size where that is
    2 or more and divides every size (two groups of one prompt share a cache group of 16
    beside groups of 8), in order of their first rows; every grouped row holds the shared
    positions, so each run may read its own first row's."""
    width = min(map(len, groups.values()))
    if width < 2 or any(len(rows) % width for rows in groups.values()):
        return list(groups.items())
    return sorted(((key, rows[i:i + width]) for key, rows in groups.items()
                   for i in range(0, len(rows), width)), key=lambda run: run[1][0])


def _consecutive(groups: list[list[int]], rows: int) -> bool:
    """The groups are all ``rows`` rows in consecutive runs of one size: members and
    places are plain reshapes."""
    return (len({len(members) for members in groups}) == 1
            and sum(groups, []) == list(range(rows)))


def cascade_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor, plan: PrefixPlan) -> torch.Tensor:
    """One query per row: q [N, H, 1, D] over each row's keys/values [N, KVH, S, D] where
    ``mask`` [N, 1, 1, S] allows, reading positions before ``plan.length`` from each
    group's source row only. A row attending to nothing gives 0."""
    n, h, _, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    per_kv = h // kvh
    shared = plan.length
    rows_q = q.reshape(n, kvh, per_kv, d)
    group_q = _by_group(rows_q, plan)
    head = _by_row(group_q @ _sources(k, plan).transpose(-1, -2), plan)
    tail = rows_q @ k[:, :, shared:].transpose(-1, -2)
    scores = torch.cat([head, tail], dim=-1) * d ** -0.5
    scores = scores.masked_fill(~mask.reshape(mask.shape[0], 1, 1, s), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no key: zeros
    out = _by_row(_by_group(probs[..., :shared], plan) @ _sources(v, plan), plan)
    return (out + probs[..., shared:] @ v[:, :, shared:]).reshape(n, h, 1, d)


def _sources(cached: torch.Tensor, plan: PrefixPlan) -> torch.Tensor:
    """[G, KVH, length, D]: each group's shared positions, from its source row."""
    shared = cached[:, :, :plan.length]
    if plan.in_order:
        return shared[::plan.members.shape[1]]
    return shared.index_select(0, plan.sources)


def _by_group(per_row: torch.Tensor, plan: PrefixPlan) -> torch.Tensor:
    """[N, KVH, P, X] -> [G, KVH, M * P, X]: each group's rows stacked per kv head."""
    _, kvh, p, x = per_row.shape
    g, m = plan.members.shape
    rows = per_row if plan.in_order else per_row.index_select(0, plan.members.flatten())
    return rows.reshape(g, m, kvh, p, x).transpose(1, 2).reshape(g, kvh, m * p, x)


def _by_row(per_group: torch.Tensor, plan: PrefixPlan) -> torch.Tensor:
    """[G, KVH, M * P, X] -> [N, KVH, P, X]: the inverse of :func:`_by_group`."""
    g, kvh, mp, x = per_group.shape
    m = plan.members.shape[1]
    p = mp // m
    flat = per_group.reshape(g, kvh, m, p, x).transpose(1, 2).reshape(g * m, kvh, p, x)
    return flat if plan.in_order else flat.index_select(0, plan.place)

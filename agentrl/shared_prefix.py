"""Rows of one group that open with the same prompt compute that prompt once in training.

A GRPO group's rollouts all start from one task, so their first rows begin with the same
tokens (often most of each row: a 70-token prompt before 10 to 40 generated tokens).
Without sharing, every row's forward and backward recompute them. With it, a micro-batch
holds each shared prompt once, as a *prefix segment*, followed by each row's remaining
tokens as a segment that attends to the prefix's keys and values and then to its own,
causally (:func:`agentrl.model.attention.varlen_attention` with ``prefix_of``). Every
trained token sees exactly the context it saw unshared, so losses and gradients are the
same up to float rounding (the prefix's gradient arrives summed over its rows instead of
row by row); only the work shrinks.

What may be shared is cut so that nothing trained lands in it: the shared span ends one
token before the earliest generated token of any of its rows, so the last prompt token
(whose output predicts each row's own first generated token) stays in every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from agentrl.types import Row

MIN_SHARED_TOKENS = 8
"""A span shorter than this is not worth a segment of its own."""


class Piece(msgspec.Struct, frozen=True):
    """One segment of a packed micro-batch: tokens ``start:end`` of row ``row`` (an index
    into the rows being collated), attending after segment ``prefix`` (-1: none)."""

    row: int
    start: int
    end: int
    prefix: int = -1


def shared_length(rows: Sequence[Row]) -> int:
    """Tokens every row of ``rows`` may share: their common prefix, stopped one token
    before the first generated token of any of them; 0 when below MIN_SHARED_TOKENS or
    with fewer than two rows."""
    if len(rows) < 2:
        return 0
    limit = min(min(len(r.token_ids), _first_generated(r.loss_mask)) for r in rows)
    heads = np.array([r.token_ids[:limit] for r in rows])
    same = (heads == heads[0]).all(axis=0)
    common = limit if same.all() else int(same.argmin())
    span = common - 1
    return span if span >= MIN_SHARED_TOKENS else 0


def _first_generated(mask: Sequence[int]) -> int:
    try:
        return list(mask).index(1)
    except ValueError:
        return len(mask)


def sharing_units(rows: Sequence[Row], indices: Sequence[int]) -> list[list[int]]:
    """``indices`` grouped into units that share a prefix: the rows of one group and one
    segment number, in order of first appearance (every other row a unit of its own)."""
    units: dict[tuple[str, int], list[int]] = {}
    for i in indices:
        units.setdefault((rows[i].group_id, rows[i].segment), []).append(i)
    return list(units.values())


def unit_tokens(rows: Sequence[Row], unit: Sequence[int]) -> int:
    """Tokens a unit occupies in a micro-batch with its prefix shared."""
    span = shared_length([rows[i] for i in unit])
    return span + sum(len(rows[i].token_ids) - span for i in unit)


def packing_units(rows: Sequence[Row], indices: Sequence[int], max_tokens: int
                  ) -> tuple[list[list[int]], list[int]]:
    """What the micro-batch planner places whole, with their token counts: the sharing
    units of ``indices``, except that a unit over ``max_tokens`` is placed row by row
    (its rows then share only with the rows that land beside them)."""
    units, lengths = [], []
    for unit in sharing_units(rows, indices):
        tokens = unit_tokens(rows, unit)
        if tokens <= max_tokens:
            units.append(unit)
            lengths.append(tokens)
            continue
        units.extend([i] for i in unit)
        lengths.extend(len(rows[i].token_ids) for i in unit)
    return units, lengths


def pieces(rows: Sequence[Row], share: bool) -> list[Piece]:
    """The segments of a micro-batch of ``rows`` (in order): each row whole, or with
    ``share`` each unit's shared prefix once, then its rows' remaining tokens."""
    if not share:
        return [Piece(i, 0, len(r.token_ids)) for i, r in enumerate(rows)]
    out: list[Piece] = []
    for unit in sharing_units(rows, range(len(rows))):
        span = shared_length([rows[i] for i in unit])
        if not span:
            out.extend(Piece(i, 0, len(rows[i].token_ids)) for i in unit)
            continue
        prefix = len(out)
        out.append(Piece(unit[0], 0, span))
        out.extend(Piece(i, span, len(rows[i].token_ids), prefix) for i in unit)
    return out

"""Recall rows: dense practice of the drills' hardest tokens, mixed into the base's SFT.

A drill demonstration spends a few hundred tokens of chat, tool calls and filler on one
or two values the answer must copy (or add), so a small model sees a binding only once
per row and learns the format long before the lookup (measured on the first base: one
fact asked 0.59, two facts 0.20, their sum 0.05). A recall row is plain text with no
chat: a list of facts in one of the drills' line formats, among filler, then several
questions, each answered the way the drills answer (``ink = 3, salt = 4, sum = 7``) or
kept the way their summaries keep (``Kept: ink = 3.``); half the rows carry page headers
with numbers up to 99 among the facts. The loss is on the answers only,
so every trained token is a lookup by name, a copy, or a sum: the generic skills, never
a task's layout. ``agentrl sft --recall-rows N`` adds N of them to every step.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from agentrl.curriculum.drills import FACT_FORMATS, FILLER, NAMES, WORDS
from agentrl.types import Row

QUERY_KINDS = ("one", "two", "sum", "keep", "add")


def recall_text(rng: random.Random, max_facts: int = 10,
                num_queries: int = 4) -> list[tuple[str, bool]]:
    """One recall row as text pieces, each flagged True where the loss applies."""
    names = rng.sample(NAMES, rng.randint(2, max_facts))
    words = rng.random() < 0.3
    values = {n: rng.choice(WORDS) if words else str(rng.randint(0, 9)) for n in names}
    form = rng.choice(FACT_FORMATS)
    lines = [form.format(name=n, value=values[n]) for n in names]
    body = []
    page, last = _pages(rng)
    for line in lines:
        if page is not None and rng.random() < 0.3:  # numbers a read's headers carry
            body.append(f"\nPage {page} of {last}.\n")
            page = min(page + 1, last)
        body += [rng.choice(FILLER) for _ in range(rng.randint(0, 4))] + [f"\n{line}\n"]
    pieces: list[tuple[str, bool]] = [(" ".join(body).replace(" \n", "\n").replace("\n ", "\n")
                                       .replace("\n\n", "\n").strip() + "\n", False)]
    for _ in range(num_queries):
        kind = rng.choice(QUERY_KINDS if not words else ("one", "two", "keep"))
        question, answer = _query(rng, kind, names, values)
        pieces += [(question, False), (answer, True)]
    return pieces


def _pages(rng: random.Random) -> tuple[int | None, int]:
    """A first page number and the last, up to 99, for headers among the facts (half the
    rows): the lookup must not depend on which numbers the context holds."""
    if rng.random() < 0.5:
        return None, 0
    last = rng.randint(2, 99)
    return rng.randint(1, last), last


def _query(rng: random.Random, kind: str, names: list[str],
           values: dict[str, str]) -> tuple[str, str]:
    """A question about the facts and its answer text."""
    a, b = rng.sample(names, 2)
    if kind == "one":
        return f"What is {a}? ", f"{a} = {values[a]}.\n"
    if kind == "two":
        return f"What are {a} and {b}, in that order? ", f"{a} = {values[a]}, {b} = {values[b]}.\n"
    if kind == "sum":
        total = int(values[a]) + int(values[b])
        return (f"What is {a} plus {b}? ",
                f"{a} = {values[a]}, {b} = {values[b]}, sum = {total}.\n")
    if kind == "keep":
        kept = [n for n in names if n in (a, b)]
        return (f"Keep what {a} and {b} need. ",
                "Kept: " + ", ".join(f"{n} = {values[n]}" for n in kept) + ".\n")
    x, y = rng.randint(0, 9), rng.randint(0, 9)
    return f"{x} + {y} = ", f"{x + y}.\n"


def recall_rows(rng: random.Random, encode: Callable[[str], list[int]],
                count: int) -> list[Row]:
    """``count`` recall rows tokenized with ``encode`` (text -> ids), the loss mask on the
    answers."""
    rows = []
    for index in range(count):
        ids: list[int] = []
        mask: list[int] = []
        for text, trained in recall_text(rng):
            piece = encode(text)
            ids += piece
            mask += [int(trained)] * len(piece)
        rows.append(Row(f"recall-{index}", "recall", "recall", 0, ids, mask,
                        [0.0] * len(ids), 0.0))
    return rows

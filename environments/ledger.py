"""Ledger: a long read whose answer needs facts from its start and its end.

A ledger of ``num_pages`` pages is read one page per ``read`` call. ``num_facts`` pages
carry an entry line (``Entry: <word>``) among ``filler_words`` words of filler: always the
first and the last page, the others at random in between. After the last page the policy
answers ``<answer>w1 w2 ...</answer>``, the entry words in page order. The whole trace is
far longer than a small context (``trace_tokens`` estimates it), so the first page's
entry is gone from the context long before the answer unless a compaction kept it:
dropping old turns loses it (the answer is then a guess among ``num_words`` words),
while a summary that carries the entries forward keeps it. :class:`KVStoreEnv
<environments.kvstore.KVStoreEnv>` is the control where only the last turn matters.

Reward: the share of entry words given in their right place; ``correct`` (held-out
accuracy) needs all of them. ``needed_facts()`` names the entries, so the run measures
how many of them each compaction kept.

Scripted policy (``demonstrate``): read until the last page, then answer
``<answer>Kept: w1 w2. Entry: w3.</answer>`` (the grader skips the labels "Kept" and
"Entry", so ``<answer>w1 w2 w3</answer>`` is graded the same); ``demonstrate_summary``
writes ``Kept: w1 w2.`` and, for the ``compact`` tool, compacts right after each page
that held an entry. The labels make every word of the answer a copy of the word that
followed the same label earlier (the summary's "Kept:", the last page's "Entry:"): a
2-layer model trained to answer the bare words never learned to pick the first one out
of the summary (it answered one constant word, for 3 SFT recipes), while it copied
after a repeated label from the start. Difficulty knobs: ``num_pages``
(reads per episode), ``num_facts``, ``filler_words`` (per page), ``num_words`` (entry
vocabulary), ``distractors`` (words of another list mixed into the filler).
"""

from __future__ import annotations

import re

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, format_call, tool
from agentrl.types import Message
from environments._verify import last_tagged

SYSTEM = ("Read the ledger page by page with the read tool, then reply <answer>the entry "
          "words in page order</answer>.")
WORDS = ("amber", "birch", "cedar", "delta", "ember", "flint", "grove", "harbor", "iris",
         "jade", "kestrel", "lotus", "maple", "nectar", "onyx", "pearl", "quartz", "raven",
         "sable", "thistle", "umber", "violet", "willow", "yarrow")
"""Entry words (the facts)."""
FILLER = ("sum", "paid", "due", "stock", "note", "carried", "total", "fee", "rent", "tax",
          "ledger", "account", "balance", "credit", "debit", "posted")
DISTRACTORS = ("copper", "silver", "cobalt", "indigo", "scarlet", "russet")
"""Words that look like entries but are filler (never an answer)."""
_ENTRY = re.compile(r"Entry: (\w+)")
MARKERS = ("kept", "entry")
"""Words an answer may use to label its entries; grading skips them."""
LAST_PAGE = "This is the last page."
NO_MORE = "There are no more pages. Reply with your answer."


class LedgerEnv(AgentEnv):
    """Read every page, then name the entry words in page order."""

    def __init__(self, num_pages: int = 8, num_facts: int = 2, filler_words: int = 12,
                 num_words: int = len(WORDS), distractors: int = 0,
                 max_turns: int | None = None, **kwargs):
        if not 2 <= num_facts <= num_pages:
            raise ValueError(f"ledger: need 2 <= num_facts <= num_pages (an entry on the first "
                             f"and the last page); got num_facts={num_facts}, "
                             f"num_pages={num_pages}")
        if not 2 <= num_words <= len(WORDS) or filler_words < 0 or distractors < 0:
            raise ValueError(f"ledger: need 2 <= num_words <= {len(WORDS)}, filler_words >= 0 "
                             f"and distractors >= 0; got {num_words}, {filler_words}, "
                             f"{distractors}")
        super().__init__(max_turns=max_turns or num_pages + 2, **kwargs)
        self.num_pages, self.num_facts = num_pages, num_facts
        self.filler_words, self.num_words, self.distractors = filler_words, num_words, distractors
        self.pages: list[str] = []
        self.next_page = 0

    @tool
    def read(self) -> str:
        """Read the next page of the ledger."""
        if self.next_page >= len(self.pages):
            return NO_MORE
        self.next_page += 1
        return self.pages[self.next_page - 1]

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Entry pages (first, last, and random ones between), their words, the filler."""
        middle = rng.choice(np.arange(1, self.num_pages - 1), self.num_facts - 2, replace=False)
        entry_pages = sorted({0, self.num_pages - 1, *map(int, middle)})
        words = [str(w) for w in rng.choice(WORDS[: self.num_words], len(entry_pages))]
        entries = dict(zip(entry_pages, words, strict=True))
        pages = [self._page(i, entries.get(i), rng) for i in range(self.num_pages)]
        prompt = f"The ledger has {self.num_pages} pages."
        return Task([Message("system", SYSTEM), Message("user", prompt)],
                    answer={"words": words, "pages": pages},
                    key=" ".join(f"{p}:{w}" for p, w in entries.items()))

    def _page(self, index: int, word: str | None, rng: np.random.Generator) -> str:
        filler = [str(w) for w in rng.choice(FILLER, self.filler_words)]
        for _ in range(self.distractors):
            filler.insert(int(rng.integers(len(filler) + 1)), str(rng.choice(DISTRACTORS)))
        half = len(filler) // 2
        lines = [f"Page {index + 1} of {self.num_pages}.", " ".join(filler[:half])]
        if word is not None:
            lines.append(f"Entry: {word}")
        lines.append(" ".join(filler[half:]))
        if index == self.num_pages - 1:
            lines.append(LAST_PAGE)
        return "\n".join(line for line in lines if line)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a task with its pages unread."""
        messages, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        self.pages, self.next_page = list(self.task.answer["pages"]), 0
        return messages, info

    def grade(self, answer: str) -> Grade:
        """The share of entry words in their right place; ``correct`` needs all."""
        assert self.task is not None
        words = self.task.answer["words"]
        given = [w for w in re.findall(r"[a-z]+", (last_tagged(answer) or answer).lower())
                 if w not in MARKERS]
        right = sum(1 for i, w in enumerate(words) if i < len(given) and given[i] == w)
        correct = float(right == len(words) and len(given) == len(words))
        return Grade(right / len(words), {"correct": correct, "pages_read": float(
            self.next_page)})

    def needed_facts(self) -> list[str]:
        """The entry words: what a compaction must keep for the answer."""
        assert self.task is not None
        return list(self.task.answer["words"])

    def demonstrate(self, messages: list[Message]) -> str:
        """Read until the last page has been read, then answer with every entry."""
        tools = [m.content for m in messages if m.role == "tool"]
        if tools and (LAST_PAGE in tools[-1] or NO_MORE in tools[-1]):
            *kept, last = _entries(messages)
            head = f"Kept: {' '.join(kept)}. " if kept else ""
            return f"<answer>{head}Entry: {last}.</answer>"
        return format_call("read")

    def demonstrate_summary(self, messages: list[Message], forced: bool) -> str | None:
        """The entries so far; unforced (the compact tool), only right after a page that
        held an entry, and never once the last page is read (answer instead)."""
        last = messages[-1] if messages else None
        if not forced and not (last is not None and last.role == "tool"
                               and _ENTRY.search(last.content)
                               and LAST_PAGE not in last.content):
            return None
        found = _entries(messages)
        return f"Kept: {' '.join(found)}." if found else "Kept: nothing yet."


def _entries(messages: list[Message]) -> list[str]:
    """Entry words of the tool messages, in order."""
    return [w for m in messages if m.role == "tool" for w in _ENTRY.findall(m.content)]

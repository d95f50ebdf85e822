"""Drills: the generic long-trace skills of the base model, as environments.

A drill is a read of ``1..max_pages`` pages, each holding a few facts (a name and a digit
or a word, in one of several line formats) among filler words, then a question about some
of them: report one fact, report two in order, or add two digits. The question sits in the
task message, so it survives every compaction; the facts it needs sit on random pages, the
first one often among them, so a context smaller than the read keeps them only in a
summary. The scripted policy reads every page, compacts right after each page that held a
needed fact (``demonstrate_summary``: the needed facts so far, in one of several summary
formats), and answers from what its context holds, its own summary included.

Why drills rather than one environment's tasks: a base trained on one task's layout learns
that layout (the Ledger warm start copies an entry only after the very label its summary
used); varying names, line formats, summary formats, page counts, tools and questions
leaves only the generic skills to learn: find a name anywhere in the context and copy
what follows it, keep what the question needs, add two digits, call the offered tool.
Nothing here is a built-in environment's task (no ledger entries, no documents).
"""

from __future__ import annotations

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, format_call, tool
from agentrl.types import Message

NAMES = ("apple", "boat", "cloud", "drum", "eagle", "fern", "gate", "hill", "ink", "jar",
         "kite", "lamp", "moss", "nest", "oak", "pipe", "quill", "rope", "salt", "tent",
         "urn", "vase", "wheel", "yak", "zinc", "bell", "coin", "dove", "fig", "gem",
         "hat", "key", "lime", "mug", "nut", "owl", "pen", "ring", "sock", "toy")
"""Fact names: one word each, drawn per task."""
WORDS = ("red", "blue", "green", "gold", "gray", "pink", "tan", "teal", "navy", "plum")
"""Word values (the other facts are digits)."""
FILLER = ("the", "old", "list", "notes", "line", "items", "shelf", "box", "row", "side",
          "left", "right", "top", "near", "far", "small", "large", "other", "some", "few")
FACT_FORMATS = ("{name}: {value}", "{name} = {value}", "{value} {name}", "{name} is {value}")
"""How a page writes a fact; one per task."""
SUMMARY_FORMATS = ("{facts}.", "Facts: {facts}.", "Kept {facts}.", "Notes: {facts}.")
"""How a summary lists the needed facts so far; one per task."""
QUESTIONS = ("one", "two", "sum")
NO_MORE = "There are no more pages. Reply with your answer."
KEEPS = ("needed", "random", "none")
"""What the scripted summary keeps: the facts the question needs (a correct policy), one
random fact of each page it compacts after (a demonstrator that compacts at the right
moments but keeps the wrong facts: only reward can teach which ones matter), or none."""


class DrillEnv(AgentEnv):
    """Read every page with ``read``, then answer a question about some facts.

    ``asked_on_first``: every asked fact sits on the first page, which then holds
    ``facts_per_page`` facts, so the moment to compact is always right after it and only
    which of its facts to keep is left to learn (``configs/drill_keep.toml``)."""

    def __init__(self, max_pages: int = 12, min_pages: int = 1, facts_per_page: int = 2,
                 filler_words: int = 8,
                 questions: tuple[str, ...] = QUESTIONS, keeps: str = "needed",
                 read_all: bool = False, asked_on_first: bool = False,
                 max_turns: int | None = None, **kwargs):
        if not 1 <= min_pages <= max_pages or facts_per_page < 1 or filler_words < 0:
            raise ValueError(f"drill: need 1 <= min_pages <= max_pages, facts_per_page >= 1, "
                             f"filler_words >= 0; got {min_pages}, {max_pages}, "
                             f"{facts_per_page}, {filler_words}")
        unknown = set(questions) - set(QUESTIONS)
        if unknown or not questions:
            raise ValueError(f"drill: questions {sorted(unknown) or '[]'} unknown; choose "
                             f"among {QUESTIONS}")
        if max_pages * facts_per_page > len(NAMES):
            raise ValueError(f"drill: max_pages * facts_per_page = {max_pages * facts_per_page} "
                             f"facts need distinct names; at most {len(NAMES)}")
        if keeps not in KEEPS:
            raise ValueError(f"drill: keeps={keeps!r} unknown; choose among {KEEPS}")
        asked = 2 if set(questions) - {"one"} else 1
        if asked_on_first and facts_per_page < asked:
            raise ValueError(f"drill: asked_on_first puts every asked fact on the first page; "
                             f"questions {sorted(questions)} ask {asked}, so facts_per_page "
                             f"must be at least {asked}, got {facts_per_page}")
        super().__init__(max_turns=max_turns or 2 * max_pages + 2, **kwargs)
        self.keeps, self.read_all, self.asked_on_first = keeps, read_all, asked_on_first
        self.min_pages, self.max_pages, self.facts_per_page = min_pages, max_pages, facts_per_page
        self.filler_words, self.questions = filler_words, tuple(questions)
        self.pages: list[str] = []
        self.next_page = 0

    @tool
    def read(self) -> str:
        """Read the next page."""
        if self.next_page >= len(self.pages):
            return NO_MORE
        self.next_page += 1
        return self.pages[self.next_page - 1]

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Pages of facts, a question about one or two of them, and the answer."""
        num_pages = int(rng.integers(self.min_pages, self.max_pages + 1))
        question = str(rng.choice(self.questions))
        fact_format = str(rng.choice(FACT_FORMATS))
        per_page = [int(rng.integers(1, self.facts_per_page + 1)) for _ in range(num_pages)]
        if self.asked_on_first:
            per_page[0] = self.facts_per_page
        per_page[-1] += max(0, 2 - sum(per_page))  # every question has two facts to ask
        names = [str(n) for n in rng.choice(NAMES, sum(per_page), replace=False)]
        words = question == "two" and rng.random() < 0.5
        values = [str(rng.choice(WORDS)) if words else str(int(rng.integers(0, 10)))
                  for _ in names]
        facts = list(zip(names, values, strict=True))
        where = np.repeat(np.arange(num_pages), per_page)
        count = 1 if question == "one" else 2
        asked = (sorted(int(i) for i in rng.choice(per_page[0], count, replace=False))
                 if self.asked_on_first else _asked(rng, where, count))
        # half the reads are the last pages of a longer list: page numbers up to 99 in the
        # prompt and the headers, whatever the read's length
        first = 1 if rng.random() < 0.5 else int(rng.integers(1, 100 - num_pages))
        last = first + num_pages - 1
        pages = [self._page(rng, f"Page {first + i} of {last}.",
                            [fact_format.format(name=n, value=v)
                             for (n, v), p in zip(facts, where, strict=True) if p == i])
                 for i in range(num_pages)]
        needed = [facts[i] for i in asked]
        span = "" if first == 1 else f", pages {first} to {last}"
        prompt = f"There are {num_pages} pages{span}. {_question_text(question, needed)}"
        answer = {"pages": pages, "needed": needed, "question": question,
                  "overshoot": bool(rng.random() < 0.5),
                  "lines": [fact_format.format(name=n, value=v) for n, v in needed],
                  "summary": str(rng.choice(SUMMARY_FORMATS))}
        system = "Read the pages with the read tool, then reply <answer>your answer</answer>."
        return Task([Message("system", system), Message("user", prompt)], answer=answer,
                    key="|".join(pages) + prompt)

    def _page(self, rng: np.random.Generator, header: str, lines: list[str]) -> str:
        filler = [str(w) for w in rng.choice(FILLER, self.filler_words)]
        for line in lines:
            filler.insert(int(rng.integers(len(filler) + 1)), f"\n{line}\n")
        text = " ".join(filler).replace(" \n", "\n").replace("\n ", "\n")
        while "\n\n" in text:
            text = text.replace("\n\n", "\n")
        return f"{header}\n{text.strip()}"

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a task with its pages unread."""
        messages, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        self.pages, self.next_page = list(self.task.answer["pages"]), 0
        return messages, info

    def grade(self, answer: str) -> Grade:
        """1 for the answer inside ``<answer>...</answer>``, bare (``7``) or labelled as
        the script writes it (``salt = 4, ink = 3, sum = 7``), else 0. With ``read_all``
        an answer before the last page is read scores 0: answering right after the page
        that holds the fact would otherwise skip the summary that has to carry it."""
        assert self.task is not None
        text = answer.split("<answer>")[-1].split("</answer>")[0].strip().rstrip(".")
        read = self.next_page >= len(self.pages) or not self.read_all
        right = float(read and text in (expected_answer(self.task.answer),
                                        labelled_answer(self.task.answer)))
        return Grade(right, {"correct": right, "pages_read": float(self.next_page)})

    def needed_facts(self) -> list[str]:
        """The fact lines the question needs, as the pages write them."""
        assert self.task is not None
        return list(self.task.answer["lines"])

    def demonstrate(self, messages: list[Message]) -> str:
        """Read until no page is left (half the tasks: until the tool says so), then
        answer: the policy learns both to stop at the last page and to stop when told."""
        assert self.task is not None
        told = bool(messages) and messages[-1].role == "tool" and NO_MORE in messages[-1].content
        if self.next_page < len(self.pages) or (self.task.answer["overshoot"] and not told):
            return format_call("read")
        return f"<answer>{labelled_answer(self.task.answer)}</answer>"

    def demonstrate_summary(self, messages: list[Message], forced: bool) -> str | None:
        """The needed facts read so far; unforced, only right after a page that held one
        (and never after the last page: answer instead)."""
        assert self.task is not None
        lines = self.task.answer["lines"]
        last = messages[-1] if messages else None
        fresh = last is not None and last.role == "tool" and any(
            line in last.content for line in lines)
        if not forced and (not fresh or self.next_page >= len(self.pages)):
            return None
        kept = self._kept(lines, [m.content for m in messages if m.role == "tool"])
        return self.task.answer["summary"].format(facts=", ".join(kept) or "none yet")

    def _kept(self, lines: list[str], observations: list[str]) -> list[str]:
        """The facts this demonstrator's summary holds after ``observations``."""
        if self.keeps == "needed":
            return [line for line in lines if any(line in text for text in observations)]
        if self.keeps == "none":
            return []
        pages = [text for text in observations if any(line in text for line in lines)]
        return [_random_fact(text) for text in pages]


def _random_fact(page: str) -> str:
    """One fact line of a page, picked by a hash of the page (the same at every call)."""
    import hashlib

    facts = [line for line in page.splitlines()[1:]
             if set(line.replace(":", " ").replace("=", " ").split()) & set(NAMES)]
    digest = int.from_bytes(hashlib.sha256(page.encode()).digest()[:4], "big")
    return facts[digest % len(facts)]


def expected_answer(answer: dict) -> str:
    """The exact answer text a task expects."""
    values = [v for _, v in answer["needed"]]
    if answer["question"] == "sum":
        return str(sum(int(v) for v in values))
    return " ".join(values)


def labelled_answer(answer: dict) -> str:
    """The answer with each fact's name before its value, as the script writes it: every
    value is then a copy of what followed its name earlier (on a page or in a summary),
    and a sum adds two digits just written."""
    labelled = ", ".join(f"{n} = {v}" for n, v in answer["needed"])
    if answer["question"] == "sum":
        return f"{labelled}, sum = {expected_answer(answer)}"
    return labelled


def _asked(rng: np.random.Generator, where: np.ndarray, count: int) -> list[int]:
    """Indices of the asked facts: the first page's among them half of the time."""
    first = [i for i, p in enumerate(where) if p == 0]
    picks = [int(rng.choice(first))] if rng.random() < 0.5 else []
    rest = [i for i in range(len(where)) if i not in picks]
    picks += [int(i) for i in rng.choice(rest, min(count - len(picks), len(rest)),
                                         replace=False)]
    return sorted(picks)[:count] if len(picks) >= count else picks


def _question_text(question: str, needed: list[tuple[str, str]]) -> str:
    names = [n for n, _ in needed]
    if question == "one":
        return f"What is {names[0]}?"
    if question == "two":
        return f"What are {names[0]} and {names[1]}, in that order?"
    return f"What is {names[0]} plus {names[1]}?"

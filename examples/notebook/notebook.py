"""Notebook: a long read whose answer needs a word from the first page and one from the last."""

from __future__ import annotations

import numpy as np

from agentrl import AgentEnv, Grade, Message, Task, format_call, tool

WORDS = ("amber", "birch", "cedar", "delta", "ember", "flint", "grove", "harbor", "iris",
         "jade", "lotus", "maple")
FILLER = ("sum", "paid", "due", "stock", "note", "carried", "total", "fee", "rent", "tax")
SYSTEM = ("Read the notebook page by page with the read tool, then reply <answer>the words "
          "of the first and the last page</answer>.")
LAST = "This is the last page."


class NotebookEnv(AgentEnv):
    """Read every page, then name the first page's word and the last page's."""

    def __init__(self, num_pages: int = 6, filler_words: int = 20, **kwargs):
        kwargs.setdefault("max_turns", num_pages + 4)  # the reads, the answer, and spare
        super().__init__(**kwargs)
        if num_pages < 2 or filler_words < 0:
            raise ValueError(f"notebook: need num_pages >= 2 and filler_words >= 0; got "
                             f"{num_pages}, {filler_words}")
        self.num_pages, self.filler_words = num_pages, filler_words

    @tool
    def read(self) -> str:
        """Read the next page of the notebook."""
        pages = self.task.answer["pages"]
        done = sum(1 for m in self.history if m.role == "tool" and m.name == "read")
        return pages[done] if done < len(pages) else "No more pages: reply with your answer."

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Pages of filler; a word on the first page and one on the last."""
        words = [str(w) for w in rng.choice(WORDS, 2, replace=False)]
        pages = []
        for index in range(self.num_pages):
            lines = [f"Page {index + 1} of {self.num_pages}.",
                     " ".join(str(w) for w in rng.choice(FILLER, self.filler_words))]
            if index in (0, self.num_pages - 1):
                lines.insert(1, f"Word: {words[index > 0]}")
            pages.append("\n".join(lines + [LAST] * (index == self.num_pages - 1)))
        question = Message("user", f"The notebook has {self.num_pages} pages.")
        return Task([Message("system", SYSTEM), question],
                    answer={"words": words, "pages": pages}, key=" ".join(pages))

    def grade(self, answer: str) -> Grade:
        """The share of the two words given in order; ``correct`` needs both."""
        given = [w for w in answer.split("<answer>")[-1].lower().replace(".", " ").split()
                 if w in WORDS]
        right = sum(a == b for a, b in zip(given, self.task.answer["words"], strict=False))
        return Grade(right / 2, {"correct": float(right == 2 and len(given) == 2)})

    def needed_facts(self) -> list[str]:
        """What a compaction must keep: the two words, as the pages write them."""
        return list(self.task.answer["words"])

    def demonstrate(self, messages: list[Message]) -> str:
        """Read until the last page, then answer with the kept word and the last one."""
        if messages[-1].role == "tool" and LAST in messages[-1].content:
            first, last = _words(messages)[0], _words(messages)[-1]
            return f"<answer>Kept: {first}. Word: {last}.</answer>"
        return format_call("read")

    def demonstrate_summary(self, messages: list[Message], forced: bool) -> str | None:
        """What to keep: the first page's word. Unforced (the compact tool), only right
        after the page that showed it; forced (the context is full), always."""
        newest = messages[-1]
        if not forced and not (newest.role == "tool" and "Word:" in newest.content
                               and LAST not in newest.content):
            return None
        words = _words(messages)
        return f"Kept: {words[0]}." if words else "Kept: nothing yet."


def _words(messages: list[Message]) -> list[str]:
    """The words the pages read so far showed, in order."""
    return [line.split()[1] for m in messages if m.role == "tool"
            for line in m.content.splitlines() if line.startswith("Word: ")]

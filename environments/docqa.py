"""DocQA: a code in several documents; a reader's task plus a whole document overflow the context.

A person's code (four different digits) is written on one page of one of ``num_docs`` documents;
every document has ``pages_per_doc`` pages of ``page_words`` filler words, and
``num_distractors`` other pages name other people's codes. The question names the person;
the answer is ``<answer>CODE</answer>``. With the defaults (two documents of two pages of
60 words, about 85 tokens a page in the warm start's tokens) a reader's task (~100 tokens)
and its whole document do not fit the 240-token context of ``configs/docqa.toml``; the
task and one page do. Pages are short on purpose: a tiny model's copy of the code from
the page (see below) failed when the page put it 100-190 tokens before the answer.

With ``delegate=True`` (the default) the main thread has one tool, the subagent
``search_document(doc)``: a reader with a fresh context (its task, built from the call's
``doc`` and the question's person: "Find the code of kay in document 1") pages through
that one document with ``read_page(page)`` (a tool that reads the document its thread was
given: ``AgentEnv.thread_arguments``) and answers ``found #CODE``, or ``none``. The natural
solution calls it once per document in one turn (the calls run concurrently) and answers
with the code one of them found: two main turns, however long the documents. With
``delegate=False`` the main thread has ``read(doc, page)`` itself and must page through
every document in its own turns and context (compaction keeps only the newest page): the
task without subagents. Under the same ``rollout.max_turns`` as a thread of the tree (3
in ``configs/docqa.toml``) it reads only part of the collection; bench/subagents.py's
control gives its one thread the whole tree's turns, tokens and compactions instead.

:func:`scripted_action` plays either way from what the model sees after compaction (the
task and the newest tool messages); it is the ``demonstrate`` hook for ``agentrl sft`` and
``agentrl check-env``. Its answers are labelled, as Ledger's are: a page writes ``the code
of kay is #1234``, a reader replies ``found #1234`` and the main thread answers
``<answer>found #1234</answer>`` (graded on the number), so every digit of an answer
follows the same `` #`` token as on the page or in the reader's reply, the one place it
occurs in the context, and its four digits differ (:func:`distinct_digits_code`). A tiny
model copies after a repeated label; the earlier warm start (unlabelled answers, no copy
pretraining) solved no held-out task. ``demo_search_share`` below 1 makes it a weaker
demonstrator, which on the other tasks searches document 0 only (right when the code is
there): a warm start on it stops after one search, and RL learns to search both.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, format_call, subagent, tool
from agentrl.types import Message
from environments._verify import extract_number, last_tagged

MAIN_SYSTEM = ("Find the person's code in the documents. Call search_document once for "
               "each document, then reply <answer>code</answer> with the code found.")
MAIN_SYSTEM_ALONE = ("Find the person's code in the documents. Read them with read, page "
                     "by page, then reply <answer>code</answer>.")
READER_SYSTEM = ("Read your document with read_page, page by page. If a page gives the "
                 "code of the person asked for, reply found and the code. After the last "
                 "page without it, reply none.")
NAMES = ("ada", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ivy", "jo", "kay", "lu")
FILLER = ("river", "stone", "paper", "lamp", "green", "north", "quiet", "table", "cloud",
          "field", "glass", "metal", "story", "winter", "market", "bridge")
_DOCS = re.compile(r"documents 0 to (\d+)")
_ASKED = re.compile(r"code of (\w+) in document (\d+)")
_QUESTION = re.compile(r"What is the code of (\w+)\?")
_PAGE = re.compile(r"document (\d+) page (\d+) of (\d+)")
FOUND = "found"
"""The label of a found code: a reader replies ``found #1234``, the main thread answers
``<answer>found #1234</answer>`` (the page writes ``the code of kay is #1234``)."""
_FOUND = re.compile(rf"{FOUND} #\d+")


def distinct_digits_code(rng: np.random.Generator) -> int:
    """Four different digits, the first not 0: a tiny model copies a code digit by digit
    (attend to the digit after the one just written), which a repeated digit makes
    ambiguous (4415: after the first 4, a 4 or a 1?). Warm starts on codes with repeats
    answered 4488 for 4415."""
    first = int(rng.integers(1, 10))
    rest = rng.choice([d for d in range(10) if d != first], 3, replace=False)
    return int("".join(map(str, [first, *rest])))


def scripted_action(messages: list[Message], search_all: bool = True) -> str:
    """The correct next message of whichever thread ``messages`` is (see module doc);
    with ``search_all=False`` the main thread searches document 0 only (a weaker policy,
    right only when the code is there)."""
    system = messages[0].content
    if system == READER_SYSTEM:
        return _reader_action(messages)
    name, num_docs = _question(messages)
    if system == MAIN_SYSTEM:
        if messages[-1].role != "tool":
            docs = range(num_docs if search_all else 1)
            return "".join(format_call("search_document", doc=doc) for doc in docs)
        found = [m.content for m in messages if m.role == "tool" and _FOUND.fullmatch(m.content)]
        return f"<answer>{found[-1] if found else 0}</answer>"
    return _read_next(messages, name, last_doc=num_docs - 1, answer="<answer>{}</answer>")


def _reader_action(messages: list[Message]) -> str:
    asked = _ASKED.search(messages[1].content)
    return _read_next(messages, asked.group(1) if asked else "", last_doc=0, answer="{}",
                      call=lambda doc, page: format_call("read_page", page=page))


def _read_next(messages: list[Message], name: str, last_doc: int, answer: str,
               call: Any = None) -> str:
    """Read on from the newest page: the code when it names ``name``, else the next page
    (of the next document after a document's last page), else ``none`` / 0. ``call``
    writes a read (a reader's ``read_page(page)``; the main thread's ``read(doc, page)``)."""
    call = call or (lambda doc, page: format_call("read", doc=doc, page=page))
    last = messages[-1]
    if last.role != "tool" or not (where := _PAGE.search(last.content)):
        return call(0, 0)
    if found := re.search(rf"code of {name} is #(\d+)", last.content):
        return answer.format(f"{FOUND} #{found.group(1)}")
    doc, page, pages = (int(g) for g in where.groups())
    if page + 1 < pages:
        return call(doc, page + 1)
    if doc < last_doc:
        return call(doc + 1, 0)
    return answer.format("none" if answer == "{}" else 0)


def _question(messages: list[Message]) -> tuple[str, int]:
    task = next(m.content for m in messages if m.role == "user")
    asked, docs = _QUESTION.search(task), _DOCS.search(task)
    return (asked.group(1) if asked else "", int(docs.group(1)) + 1 if docs else 1)


class DocQAEnv(AgentEnv):
    """Find a code in one of several long documents; reward 1.0 for the right code."""

    max_turns = 6

    def __init__(self, num_docs: int = 2, pages_per_doc: int = 2, page_words: int = 60,
                 num_distractors: int = 0, delegate: bool = True,
                 demo_search_share: float = 1.0, **kwargs):
        """``demo_search_share``: the share of tasks on which :meth:`demonstrate` searches
        every document; on the others it searches document 0 only, so a warm start on its
        (correct) episodes often stops after one search, which RL can teach it not to."""
        super().__init__(**kwargs)
        if not 0.0 <= demo_search_share <= 1.0:
            raise ValueError(f"docqa: demo_search_share is {demo_search_share}; it must be "
                             "in [0, 1]")
        if num_docs < 1 or pages_per_doc < 1 or page_words < 0 or num_distractors < 0:
            raise ValueError(f"docqa: need num_docs >= 1, pages_per_doc >= 1, page_words >= 0 "
                             f"and num_distractors >= 0; got {num_docs}, {pages_per_doc}, "
                             f"{page_words}, {num_distractors}")
        if num_distractors >= pages_per_doc * num_docs or num_distractors + 1 > len(NAMES):
            raise ValueError(f"docqa: num_distractors = {num_distractors} does not fit "
                             f"{num_docs} x {pages_per_doc} pages and {len(NAMES)} names")
        self.num_docs, self.pages_per_doc = num_docs, pages_per_doc
        self.page_words, self.num_distractors = page_words, num_distractors
        self.delegate, self.demo_search_share = delegate, demo_search_share
        self.main_tools = ("search_document",) if delegate else ("read",)

    @tool
    def read(self, doc: int, page: int) -> str:
        """One page of a document.

        Args:
            doc: The document, from 0.
            page: The page, from 0.
        """
        docs = self.task.answer["docs"]
        if not (0 <= doc < len(docs) and 0 <= page < len(docs[doc])):
            raise ValueError(f"there are documents 0 to {len(docs) - 1}, each with pages 0 "
                             f"to {self.pages_per_doc - 1}")
        return docs[doc][page]

    @tool
    def read_page(self, page: int) -> str:
        """One page of the document you were given.

        Args:
            page: The page, from 0.
        """
        return self.read(int(self.thread_arguments().get("doc", 0)), page)

    @subagent(system=READER_SYSTEM, tools=("read_page",))
    def search_document(self, doc: int) -> str:
        """A reader with a fresh context looks for the person's code in one document.

        Args:
            doc: The document to search, from 0.
        """
        if not 0 <= doc < self.num_docs:
            raise ValueError(f"there are documents 0 to {self.num_docs - 1}")
        name = self.task.answer["name"]
        return f"Find the code of {name} in document {doc}. It has {self.pages_per_doc} pages."

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Documents of filler pages; the person's code on one page, distractors on others."""
        people = [str(n) for n in rng.choice(NAMES, self.num_distractors + 1, replace=False)]
        code = distinct_digits_code(rng)
        slots = rng.choice(self.num_docs * self.pages_per_doc, len(people), replace=False)
        facts = {int(s): (p, code if i == 0 else distinct_digits_code(rng))
                 for i, (s, p) in enumerate(zip(slots, people, strict=True))}
        docs = [[self._page(rng, d, p, facts.get(d * self.pages_per_doc + p))
                 for p in range(self.pages_per_doc)] for d in range(self.num_docs)]
        question = (f"What is the code of {people[0]}? It is on one page of documents 0 to "
                    f"{self.num_docs - 1}, each {self.pages_per_doc} pages long.")
        system = MAIN_SYSTEM if self.delegate else MAIN_SYSTEM_ALONE
        return Task([Message("system", system), Message("user", question)],
                    answer={"code": code, "name": people[0], "docs": docs},
                    key=f"{people[0]}:{code}:{int(slots[0])}:{'/'.join(map(str, slots))}")

    def grade(self, answer: str) -> Grade:
        """1.0 for the person's code; ``subagents`` counts the delegations made."""
        tagged = last_tagged(answer)
        number = extract_number(tagged if tagged is not None else answer)
        correct = float(number is not None and number == self.task.answer["code"])
        return Grade(correct, {"correct": correct, "subagents": float(len(self.threads.threads))})

    def demonstrate(self, messages: list[Message]) -> str:
        """The scripted policy (see :func:`scripted_action`); whether it searches every
        document is a stable draw from the task (``demo_search_share``)."""
        draw = zlib.crc32(self.task.key.encode()) / 2**32
        return scripted_action(messages, search_all=draw < self.demo_search_share)

    def _page(self, rng: np.random.Generator, doc: int, page: int,
              fact: tuple[str, int] | None) -> str:
        words = [str(w) for w in rng.choice(FILLER, self.page_words)]
        if fact is not None:  # in place of filler: every page is about as long
            sentence = f"the code of {fact[0]} is #{fact[1]} .".split()
            at = int(rng.integers(0, max(len(words) - len(sentence), 0) + 1))
            words[at:at + len(sentence)] = sentence
        end = "next page follows" if page + 1 < self.pages_per_doc else "last page"
        header = f"document {doc} page {page} of {self.pages_per_doc}"
        return f"{header}\n{' '.join(words)}\n({end})"

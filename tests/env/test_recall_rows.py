"""Recall rows: every trained token is an answer that the row's facts determine, and the
loss never falls on the facts or the questions."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.curriculum.drills import NAMES
from agentrl.curriculum.recall import recall_rows, recall_text


def facts_of(text: str) -> dict[str, str]:
    """Name -> value, read back from the fact block in any of the drills' line formats."""
    facts = {}
    for line in text.splitlines():
        words = line.replace(":", " ").replace("=", " ").split()
        if len(words) == 2 and words[0] in NAMES:  # "salt: 4", "salt = 4"
            facts[words[0]] = words[1]
        elif len(words) == 2 and words[1] in NAMES:  # "4 salt"
            facts[words[1]] = words[0]
        elif len(words) == 3 and words[1] == "is" and words[0] in NAMES:
            facts[words[0]] = words[2]
    return facts


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000))
def test_every_answer_follows_from_the_facts_and_only_answers_are_trained(seed):
    pieces = recall_text(random.Random(seed))
    block, trained = pieces[0], pieces[1:]
    assert block[1] is False
    facts = facts_of(block[0])
    assert len(facts) >= 2
    for (question, q_trained), (answer, a_trained) in zip(trained[::2], trained[1::2],
                                                          strict=True):
        assert (q_trained, a_trained) == (False, True)
        sums = re.fullmatch(r"(\d) \+ (\d) = ", question)
        if sums:
            assert answer == f"{int(sums[1]) + int(sums[2])}.\n"
            continue
        pairs = re.findall(r"(\w+) = (\w+)", answer)
        asked = [n for n in re.findall(r"\w+", question) if n in NAMES]
        in_order = sorted(asked, key=list(facts).index)  # a summary keeps page order
        assert [n for n, _ in pairs if n != "sum"] == (
            in_order if question.startswith("Keep") else asked)
        for name, value in pairs:
            if name == "sum":
                assert int(value) == sum(int(facts[n]) for n in asked)
            else:
                assert facts[name] == value


def test_rows_mask_exactly_the_answer_tokens():
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]  # one id per character: masks line up with text

    rows = recall_rows(random.Random(3), encode, 8)
    for row in rows:
        text = "".join(map(chr, row.token_ids))
        trained = "".join(chr(t) for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m)
        assert trained and len(row.loss_mask) == len(row.token_ids)
        assert all(line.endswith(".") for line in trained.splitlines())
        assert "What" in text and "What" not in trained

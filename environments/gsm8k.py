"""GSM8K: grade-school math word problems from a local JSONL or Parquet file.

Each record has ``question`` and ``answer``; the gold number is what follows ``####`` in
``answer`` (the GSM8K format), or the whole ``answer`` when it is a bare number. Nothing
is downloaded: ``path`` names a local file (default: the 20-problem sample shipped in
``environments/data/gsm8k_sample.jsonl``). Parquet needs ``pip install pyarrow``.

Held-out tasks: with ``eval_path`` the eval split is that file; otherwise every
``eval_every``-th problem of ``path`` (index 0, eval_every, 2·eval_every, ...) is held
out and never drawn for training.

The verifier is numeric and tolerant of formatting (commas, currency signs, units,
trailing period, ``\\boxed{}``, ``#### 42``, "The answer is 42.").
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task
from agentrl.types import Message
from environments._verify import extract_number, numbers_equal

SAMPLE_PATH = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"
SYSTEM = ("Solve the math problem. Think step by step, then give the final number "
          "after '####'.")


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Read question/answer records from JSONL or Parquet."""
    path = Path(path)
    if not path.exists():
        looked = "" if path.is_absolute() else f" (looked at {path.resolve()})"
        raise ValueError(f"gsm8k: data file {path} does not exist{looked}; "
                         "pass path=<local .jsonl or .parquet>")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(
                "gsm8k: reading Parquet needs pyarrow; `pip install pyarrow` "
                "(or `pip install agentrl[parquet]`), or convert the file to JSONL"
            ) from None
        records = pq.read_table(path).to_pylist()
    else:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, record in enumerate(records):
        if "question" not in record or "answer" not in record:
            raise ValueError(f"gsm8k: record {i} of {path} needs 'question' and 'answer' keys")
    return records


def gold_answer(answer: str | float | int) -> Fraction:
    """The gold number of a GSM8K answer field."""
    text = str(answer)
    number = extract_number(text.split("####")[-1]) if "####" in text else extract_number(text)
    if number is None:
        raise ValueError(f"gsm8k: no number in the answer field {text[-80:]!r}")
    return number


class GSM8KEnv(AgentEnv):
    """Single-turn math; reward 1.0 when the final number equals the gold answer."""

    max_turns = 2

    def __init__(self, path: str | None = None, eval_path: str | None = None,
                 eval_every: int = 10, **kwargs):
        super().__init__(**kwargs)
        records = load_records(path or SAMPLE_PATH)
        if eval_path is not None:
            self.splits = {"train": records, "eval": load_records(eval_path)}
        else:
            if eval_every < 2:
                raise ValueError(f"gsm8k: eval_every is {eval_every}; it must be >= 2")
            self.splits = {
                "train": [r for i, r in enumerate(records) if i % eval_every],
                "eval": [r for i, r in enumerate(records) if i % eval_every == 0],
            }
        for split, items in self.splits.items():
            if not items:
                raise ValueError(f"gsm8k: the {split} split is empty; add problems or eval_path")

    def draw_task(self, rng: np.random.Generator, split: str) -> Task:
        """A problem of the split, chosen by the seeded generator."""
        records = self.splits[split]
        record = records[int(rng.integers(len(records)))]
        messages = [Message("system", SYSTEM), Message("user", str(record["question"]))]
        return Task(messages, answer=gold_answer(record["answer"]), key=str(record["question"]))

    def grade(self, answer: str) -> Grade:
        """1.0 when the extracted final number matches; "formatted" when one was found."""
        assert self.task is not None
        predicted = extract_number(answer)
        correct = float(numbers_equal(predicted, self.task.answer))
        return Grade(correct, {"correct": correct, "formatted": float(predicted is not None)})

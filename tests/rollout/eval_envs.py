"""A held-out task whose grading is known by hand: "Task N: say yes" (N = the reset seed).

A reply saying "yes" solves it: reward 0.5, component ``correct`` 1 (the component
decides accuracy, not the reward). ``always`` fixes the grade whatever the reply: solved
for the task numbers it lists (for the ``agentrl eval`` test, whose real model's replies
nobody can predict).
"""

from __future__ import annotations

import numpy as np

from agentrl import AgentEnv, Grade, Message, Task


class SayYes(AgentEnv):
    """One turn: task N of either split is the reset seed N itself."""

    max_turns = 1

    def __init__(self, always: list[int] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.always = always
        self.number: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.number = seed
        return super().reset(seed=seed, options=options)

    def draw_task(self, rng: np.random.Generator, split: str) -> Task:
        return Task([Message("system", "Answer."),
                     Message("user", f"Task {self.number}: say yes")],
                    answer="yes", key=f"{split}-{self.number}")

    def grade(self, answer: str) -> Grade:
        if self.always is not None:
            correct = float(self.number in self.always)
        else:
            correct = float("yes" in answer)
        return Grade(0.5 * correct, {"correct": correct})


class Pages(AgentEnv):
    """``num_pages`` turns, each answered with a bulky page; the first page shows the
    task's fact (``needed_facts``). Graded at the last page like SayYes's ``always``:
    solved for the listed task numbers, whatever the replies, so accuracy is known for a
    model nobody can predict, and a rollout that stops early (truncated) is wrong."""

    def __init__(self, num_pages: int = 2, always: list[int] | None = None,
                 page_words: int = 40, **kwargs) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1; got {num_pages}")
        super().__init__(max_turns=num_pages + 1, **kwargs)
        self.num_pages, self.always, self.page_words = num_pages, always or [], page_words
        self.number: int | None = None
        self.page = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.number, self.page = seed, 0
        return super().reset(seed=seed, options=options)

    def draw_task(self, rng: np.random.Generator, split: str) -> Task:
        return Task([Message("system", "Read."), Message("user", f"Task {self.number}.")],
                    key=f"{split}-{self.number}")

    def needed_facts(self) -> list[str]:
        return [f"fact-{self.number}"]

    def step(self, action: str):
        self.page += 1
        if self.page < self.num_pages:
            fact = f"fact-{self.number} " if self.page == 1 else ""
            page = Message("user", fact + " ".join(["page"] * self.page_words))
            return [page], 0.0, False, False, {"reward_components": {}}
        correct = float(self.number in self.always)
        return [], correct, True, False, {"reward_components": {"correct": correct}}

    def grade(self, answer: str) -> Grade:
        return Grade(0.0)

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

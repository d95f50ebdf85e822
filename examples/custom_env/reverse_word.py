"""ReverseWord: a complete agentrl environment in under 60 lines.

The model must reverse a random word. It may call the ``check`` tool to test a guess
before answering; the final answer goes inside <answer></answer>.
"""

from __future__ import annotations

import numpy as np

from agentrl import AgentEnv, Grade, Message, Task, format_call, tool

WORDS = ("agent", "reward", "policy", "token", "rollout", "gradient", "context", "sample")


class ReverseWordEnv(AgentEnv):
    """Reverse a word; reward 1.0 for the exact reversal."""

    max_turns = 3
    eval_fraction = 0.25  # of a small word list: "token" and "gradient" are held out

    def __init__(self, words: tuple[str, ...] = WORDS, **kwargs):
        super().__init__(**kwargs)
        self.words = tuple(words)

    @tool
    def check(self, guess: str) -> str:
        """Say whether a guess is the reversed word.

        Args:
            guess: The candidate reversal.
        """
        return "correct" if guess == self.task.answer else "wrong"

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Pick a word; the same seed picks the same word."""
        word = str(rng.choice(self.words))
        messages = [
            Message("system", "Reverse the word. Answer inside <answer></answer>."),
            Message("user", f"Word: {word}"),
        ]
        return Task(messages, answer=word[::-1], key=word)

    def grade(self, answer: str) -> Grade:
        """1.0 for the exact reversal inside the answer tags."""
        inner = answer.split("<answer>")[-1].split("</answer>")[0].strip()
        return Grade(float(inner == self.task.answer), {"tagged": float("<answer>" in answer)})

    def demonstrate(self, messages: list[Message]) -> str:
        """Scripted policy (for `agentrl sft`): check the reversal, then answer it."""
        if messages[-1].role != "tool":
            return format_call("check", guess=self.task.answer)
        return f"<answer>{self.task.answer}</answer>"

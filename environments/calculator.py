"""Calculator: arithmetic word problems solved with a ``calculate`` tool.

Multi-turn: the model calls ``calculate`` (``<tool_call>{"name": "calculate",
"arguments": {"expression": "37 + 45"}}</tool_call>``), reads the result, then answers with
the number alone ("82", "82.", "<answer>82</answer>" or "The answer is 82."; with
``strict_answer=False`` any text whose final number is the answer).
Reward 1.0 for the correct final answer; ``reward_components["used_calculator"]`` records
whether the tool returned a result (for logging, not rewarded).

Difficulty knobs: ``num_operations`` (1: one addition, subtraction, multiplication or
division) and ``max_number``. The CPU quickstart uses the easy default.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, format_call, tool
from agentrl.text import short_repr
from agentrl.types import Message
from environments._verify import (
    ExpressionError,
    extract_number,
    number_only,
    numbers_equal,
    parse_arithmetic,
)

SYSTEM = ("Solve the word problem. Use the calculate tool for arithmetic, then reply with "
          "the final number only.")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana")
ITEMS = ("apples", "books", "coins", "stamps", "marbles", "cards")


def format_number(value: Fraction) -> str:
    """An integer as is, anything else as a decimal with up to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    try:
        return f"{float(value):.6f}".rstrip("0").rstrip(".")
    except OverflowError:  # past the float range: exact, as numerator/denominator
        return f"{value.numerator}/{value.denominator}"


class CalculatorEnv(AgentEnv):
    """Word problems; the ``calculate`` tool evaluates + - * / expressions exactly."""

    max_turns = 4
    isolation = "inline"  # every call is quick pure Python (parsing bounded model text)

    def __init__(self, num_operations: int = 1, max_number: int = 20,
                 strict_answer: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.strict_answer = strict_answer
        if num_operations < 1 or max_number < 2:
            raise ValueError(f"calculator: need num_operations >= 1 and max_number >= 2; got "
                             f"{num_operations} and {max_number}")
        self.num_operations, self.max_number = num_operations, max_number

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / and parentheses, e.g. "(3 + 4) * 2".
        """
        try:
            value, _ = parse_arithmetic(expression, allow_unary_minus=True, allow_floats=True)
        except ExpressionError as exc:
            raise ValueError(f"cannot evaluate {short_repr(expression)}: {exc}") from None
        return format_number(value)

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A story of num_operations steps over small numbers, with an integer answer."""
        name = str(rng.choice(NAMES))
        item = str(rng.choice(ITEMS))
        value = int(rng.integers(2, self.max_number + 1))
        sentences = [f"{name} has {value} {item}."]
        for _ in range(self.num_operations):
            value, sentence = _operation(value, item, self.max_number, rng)
            sentences.append(sentence)
        sentences.append(f"How many {item} does {name} have now?")
        prompt = " ".join(sentences)
        return Task([Message("system", SYSTEM), Message("user", prompt)],
                    answer=value, key=prompt)

    def demonstrate(self, messages: list[Message]) -> str:
        """Scripted solution: ``calculate`` the story's expression, then answer with the
        number the tool returned."""
        if messages[-1].role == "tool":
            return messages[-1].content.strip()
        assert self.task is not None
        story = [m.content for m in self.task.messages if m.role == "user"][-1]
        return format_call("calculate", expression=calculator_expression(story))

    def grade(self, answer: str) -> Grade:
        """1.0 when the final number in the reply is the answer."""
        assert self.task is not None
        read = number_only if self.strict_answer else extract_number
        correct = float(numbers_equal(read(answer), Fraction(self.task.answer)))
        used = float(any(m.role == "tool" and m.name == "calculate"
                         and not m.content.startswith("Error") for m in self.history))
        return Grade(correct, {"correct": correct, "used_calculator": used})


_OPERATIONS = (
    (re.compile(r"get (\d+) more"), "+"),
    (re.compile(r"find (\d+) more"), "+"),
    (re.compile(r"give away (\d+)"), "-"),
    (re.compile(r"multiplied by (\d+)"), "*"),
    (re.compile(r"group of (\d+)"), "/"),
)


def calculator_expression(problem: str) -> str:
    """The expression a Calculator word problem asks for, e.g. ``"(16 / 2) + 3"``."""
    sentences = [s.strip() for s in problem.split(".") if s.strip()]
    start = re.search(r"has (\d+)", sentences[0])
    if start is None:
        raise ValueError(f"not a Calculator problem: {problem!r}")
    expression = start.group(1)
    for sentence in sentences[1:]:
        for pattern, op in _OPERATIONS:
            found = pattern.search(sentence)
            if found:
                if " " in expression:  # earlier steps happen first: bracket them
                    expression = f"({expression})"
                expression = f"{expression} {op} {found.group(1)}"
                break
    return expression


def _operation(value: int, item: str, max_number: int,
               rng: np.random.Generator) -> tuple[int, str]:
    kind = int(rng.integers(4))
    operand = int(rng.integers(2, max_number + 1))
    if kind == 0:
        return value + operand, f"Then they get {operand} more {item}."
    if kind == 1 and value > operand:
        return value - operand, f"Then they give away {operand} {item}."
    if kind == 2:
        return value * operand, f"Then their number of {item} is multiplied by {operand}."
    divisors = [d for d in range(2, max_number + 1) if value % d == 0 and d < value]
    if kind == 3 and divisors:
        d = int(rng.choice(divisors))
        return value // d, f"Then they share them equally with a group of {d}, keeping one share."
    return value + operand, f"Then they find {operand} more {item}."

"""Countdown: reach a target with + - * / using every given number exactly once.

The answer is an arithmetic expression, either bare (the last non-empty line of the
reply) or inside ``<answer>...</answer>`` (the last such tag wins). A trailing
``= result`` is ignored. The verifier parses with ``ast`` against a whitelist (numbers,
``+ - * /``, parentheses; no unary minus, no names, no calls) and evaluates exactly.

Difficulty knobs: ``num_numbers`` (2 is easy enough for a tiny model), ``min_number``,
``max_number``. Every generated task is solvable: the target is computed from a random
expression over the numbers.
"""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task
from agentrl.types import Message
from environments._verify import ExpressionError, last_tagged, parse_arithmetic

SYSTEM = (
    "You solve arithmetic puzzles. Reply with one expression that uses each given number "
    "exactly once with + - * / and parentheses, inside <answer></answer>."
)


def check_expression(expression: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """Whether the expression uses exactly the numbers and equals the target; and why not."""
    expression = expression.split("=")[0]
    try:
        value, literals = parse_arithmetic(expression)
    except ExpressionError as exc:
        return False, str(exc)
    if Counter(literals) != Counter(Fraction(n) for n in numbers):
        used = [int(x) for x in literals]
        return False, f"uses {sorted(used)} but must use each of {sorted(numbers)} exactly once"
    if value != target:
        return False, f"equals {value}, not {target}"
    return True, "correct"


def extract_expression(text: str) -> str:
    """The tagged answer if present, else the last non-empty line."""
    tagged = last_tagged(text)
    if tagged is not None:
        return tagged
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class CountdownEnv(AgentEnv):
    """Single-turn Countdown; reward 1.0 for a correct expression, else 0.0."""

    max_turns = 2
    isolation = "inline"  # every call is quick pure Python (parsing bounded model text)

    def __init__(self, num_numbers: int = 4, min_number: int = 1, max_number: int = 25,
                 max_target: int = 1000, **kwargs):
        super().__init__(**kwargs)
        if num_numbers < 1 or min_number < 1 or max_number < min_number:
            raise ValueError(
                f"countdown: need num_numbers >= 1 and 1 <= min_number <= max_number; got "
                f"num_numbers={num_numbers}, min_number={min_number}, max_number={max_number}"
            )
        self.num_numbers, self.min_number, self.max_number = num_numbers, min_number, max_number
        self.max_target = max_target

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Random numbers, and a positive integer target reachable with all of them."""
        while True:
            numbers = [int(n) for n in rng.integers(self.min_number, self.max_number + 1,
                                                    size=self.num_numbers)]
            target = _random_value(numbers, rng)
            if target is not None and 0 < target <= self.max_target:
                break
        prompt = (f"Numbers: {', '.join(map(str, numbers))}\nTarget: {target}\n"
                  "Use every number exactly once.")
        key = f"{sorted(numbers)}->{target}"
        return Task([Message("system", SYSTEM), Message("user", prompt)],
                    answer={"numbers": numbers, "target": target}, key=key)

    def demonstrate(self, messages: list[Message]) -> str:
        """Scripted solution: ``<answer>expression</answer>`` found by brute force."""
        assert self.task is not None
        numbers, target = self.task.answer["numbers"], self.task.answer["target"]
        return f"<answer>{countdown_solution(numbers, target)}</answer>"

    def grade(self, answer: str) -> Grade:
        """1.0 when the expression is valid and hits the target."""
        assert self.task is not None
        expression = extract_expression(answer)
        ok, _ = check_expression(expression, self.task.answer["numbers"],
                                 self.task.answer["target"])
        tagged = float(last_tagged(answer) is not None)
        return Grade(float(ok), {"correct": float(ok), "tagged": tagged})


def countdown_solution(numbers: list[int], target: int) -> str | None:
    """An expression using every number once that equals ``target`` (brute force, small)."""
    ops = ("+", "-", "*", "/")
    for order in itertools.permutations(numbers):
        for chosen in itertools.product(ops, repeat=len(order) - 1):
            value, text = Fraction(order[0]), str(order[0])
            for number, op in zip(order[1:], chosen, strict=True):
                if op == "/" and number == 0:
                    break
                value = {"+": value + number, "-": value - number, "*": value * number,
                         "/": value / number if number else value}[op]
                text = f"({text}) {op} {number}" if op in "*/" and " " in text else \
                    f"{text} {op} {number}"
            else:
                if value == target:
                    return text
    return None


def _random_value(numbers: list[int], rng: np.random.Generator) -> int | None:
    """Combine the numbers in random order with random operations; None if not integral."""
    order = [Fraction(numbers[i]) for i in rng.permutation(len(numbers))]
    value = order[0]
    for number in order[1:]:
        op = int(rng.integers(4))
        if op == 3 and value % number == 0:
            value = value / number
        elif op == 2:
            value = value * number
        elif op == 1 and value > number:
            value = value - number
        else:
            value = value + number
    return int(value) if value.denominator == 1 else None

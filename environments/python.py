"""Python: number puzzles solved by running code in the sandbox (``agentrl.sandbox``).

The tool ``run_python(code)`` runs the code in an operating-system sandbox (bubblewrap:
fresh namespaces, a read-only root holding only the interpreter, no network, a private
scratch folder) with CPU, memory, process, disk, output and wall-clock limits; the model
sees stdout, stderr and why a run stopped. The answer is the final number of the reply
(``<answer>N</answer>`` works). Reward 1.0 when it is right.

Knobs: ``max_n`` (problem size), the sandbox limits ``cpu_s``, ``wall_s``, ``memory_mb``,
``max_processes``, ``scratch_mb``, and ``isolation``: "bwrap" (default; refused at
construction where namespaces do not work) or "process" (weaker, opt-in, warns; see
docs/security.md).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from agentrl.envs import AgentEnv, Grade, Task, tool
from agentrl.sandbox import SandboxLimits, describe, require_isolation
from agentrl.sandbox import run_python as run_sandboxed
from agentrl.types import Message
from environments._verify import extract_number, numbers_equal

SYSTEM = ("Answer the question. You can run Python with the run_python tool (print what "
          "you need). Reply with the final number inside <answer></answer>.")


def _primes_below(n: int) -> list[int]:
    return [p for p in range(2, n) if all(p % d for d in range(2, int(p**0.5) + 1))]


def _fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


PROBLEMS = (
    ("What is the sum of all primes below {n}?", lambda n, k: sum(_primes_below(n))),
    ("How many integers from 1 to {n} are divisible by {k}?", lambda n, k: n // k),
    ("What is the {n}-th Fibonacci number (F(0)=0, F(1)=1) modulo {k}?",
     lambda n, k: _fibonacci(n) % k),
    ("What is the sum of the digits of {n} factorial?",
     lambda n, k: sum(int(d) for d in str(_factorial(n)))),
)


def _factorial(n: int) -> int:
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out


class PythonEnv(AgentEnv):
    """Computational questions with a sandboxed ``run_python`` tool."""

    max_turns = 4
    tool_timeout_s = 30.0  # the sandbox enforces its own, shorter wall-clock limit

    def __init__(self, max_n: int = 200, cpu_s: int = 5, wall_s: float = 10.0,
                 memory_mb: int = 512, max_processes: int = 16, scratch_mb: int = 64,
                 isolation: str = "bwrap", **kwargs):
        super().__init__(**kwargs)
        if max_n < 10:
            raise ValueError(f"python: max_n is {max_n}; it must be >= 10")
        require_isolation(isolation)  # before any model code can run
        self.max_n = max_n
        self.isolation = isolation
        self.limits = SandboxLimits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb,
                                    max_processes=max_processes, scratch_mb=scratch_mb)
        # the sandbox kills the run at wall_s; the tool call must not be abandoned before
        self.tool_timeout_s = max(type(self).tool_timeout_s, wall_s + 5.0)

    @tool
    def run_python(self, code: str) -> str:
        """Run Python code in a sandbox and return what it printed.

        Args:
            code: A Python program (standard library only); print the values you need.
        """
        return describe(run_sandboxed(code, self.limits, self.isolation))

    def sample_task(self, rng: np.random.Generator) -> Task:
        """One of the problem templates with random sizes."""
        index = int(rng.integers(len(PROBLEMS)))
        n = int(rng.integers(10, self.max_n + 1))
        k = int(rng.integers(2, 50))
        template, solve = PROBLEMS[index]
        question = template.format(n=n, k=k)
        return Task([Message("system", SYSTEM), Message("user", question)],
                    answer=solve(n, k), key=question)

    def grade(self, answer: str) -> Grade:
        """1.0 when the final number is the answer."""
        assert self.task is not None
        correct = float(numbers_equal(extract_number(answer), Fraction(self.task.answer)))
        return Grade(correct, {"correct": correct})

"""LogSearch: find which service a failed request was for, in a log, with grep and read."""

from __future__ import annotations

import zlib

import numpy as np

from agentrl import AgentEnv, Grade, Message, Task, format_call, tool

SERVICES = ("auth", "cart", "search", "payment", "mail")
SYSTEM = ("A request in the log failed: find the service it was for. Use the grep and "
          "read tools, then answer <answer>service</answer>.")


class LogSearchEnv(AgentEnv):
    """One request in the log failed; reward 1.0 for naming its service."""

    max_turns = 4

    def __init__(self, num_lines: int = 30, demo_read_share: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if num_lines < 8:
            raise ValueError(f"logsearch: num_lines is {num_lines}; it must be >= 8")
        if not 0.0 <= demo_read_share <= 1.0:
            raise ValueError(f"logsearch: demo_read_share is {demo_read_share}; it must "
                             "be in [0, 1]")
        self.num_lines = num_lines
        self.demo_read_share = demo_read_share

    @tool
    def grep(self, pattern: str) -> str:
        """The log lines that contain a text, each with the two lines before and after.

        Args:
            pattern: The text to look for, e.g. "ERROR".
        """
        lines = self.task.answer["log"]
        hits = [i for i, line in enumerate(lines) if pattern in line][:3]
        shown = sorted({j for i in hits for j in range(max(i - 2, 0), min(i + 3, len(lines)))})
        return "\n".join(f"{j}: {lines[j]}" for j in shown) or "no match"

    @tool
    def read(self, line: int) -> str:
        """One line of the log.

        Args:
            line: The line's number.
        """
        lines = self.task.answer["log"]
        if not 0 <= line < len(lines):
            raise ValueError(f"the log has lines 0 to {len(lines) - 1}")
        return f"{line}: {lines[line]}"

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A log of finished requests; one started, then its service crashed."""
        ids = [f"r{n:04x}" for n in rng.choice(16**4, self.num_lines, replace=False)]
        log = [f"INFO request {i} {rng.choice(SERVICES)} ok {rng.integers(5, 99)} ms"
               for i in ids]
        start = int(rng.integers(0, self.num_lines // 2))
        crash = int(rng.integers(self.num_lines // 2 + 3, self.num_lines))
        service = rng.choice(SERVICES)
        log[start] = f"INFO request {ids[start]} {service} started"
        log[crash] = f"ERROR crashed: the request began on line {start}"
        question = Message("user", f"The log has {self.num_lines} lines. Which service?")
        return Task([Message("system", SYSTEM), question],
                    answer={"log": log, "service": service}, key=" ".join(log))

    def grade(self, answer: str) -> Grade:
        """1.0 for the failed request's service inside <answer></answer>."""
        given = answer.split("<answer>")[-1].split("</answer>")[0].strip()
        return Grade(float(given == self.task.answer["service"]))

    def demonstrate(self, messages: list[Message]) -> str:
        """Scripted solution: grep the error, read the line it names, answer its service.
        On a share ``1 - demo_read_share`` of the tasks (a fixed draw per task) it guesses
        instead: the service of the first line grep showed, right about 1 time in 5."""
        last = messages[-1]
        if last.role != "tool":
            return format_call("grep", pattern="ERROR")
        if last.name == "grep":
            if zlib.crc32(self.task.key.encode()) / 2**32 >= self.demo_read_share:
                return f"<answer> {last.content.split()[4]}</answer>"
            error = next(line for line in last.content.splitlines() if "ERROR" in line)
            return format_call("read", line=int(error.split()[-1]))
        return f"<answer> {last.content.split()[4]}</answer>"

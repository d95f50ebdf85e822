"""Graders for the test harnesses: ``grader(task, final) -> reward``."""


def yes(task, final: str) -> float:
    """1.0 for the final answer "yes"."""
    return float(final.strip() == "yes")


def number(task, final: str) -> float:
    """The final answer read as a number (the attack programs report what they got)."""
    return float(final.strip())

"""Deterministic verifier helpers shared by the built-in environments.

Arithmetic is parsed with ``ast`` against a whitelist of nodes and evaluated with exact
fractions: model text is never ``eval``-ed.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 300
"""Longer expressions are refused before parsing (deep nesting can exhaust the parser)."""

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class ExpressionError(ValueError):
    """The text is not an allowed arithmetic expression (the message says why)."""


def parse_arithmetic(text: str, allow_unary_minus: bool = False,
                     allow_floats: bool = False) -> tuple[Fraction, list[Fraction]]:
    """Evaluate ``+ - * /`` over number literals exactly; return (value, literals used)."""
    text = text.strip()
    if not text:
        raise ExpressionError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.replace("×", "*").replace("÷", "/"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an arithmetic expression ({type(exc).__name__})") from None
    literals: list[Fraction] = []
    value = _evaluate(tree.body, literals, allow_unary_minus, allow_floats)
    return value, literals


def _evaluate(node: ast.AST, literals: list[Fraction], unary: bool, floats: bool) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in ((int, float) if floats else (int,)):
        literals.append(Fraction(node.value))
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _evaluate(node.left, literals, unary, floats)
        right = _evaluate(node.right, literals, unary, floats)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _OPS[type(node.op)](left, right)
    if unary and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _evaluate(node.operand, literals, unary, floats)
        return -inner if isinstance(node.op, ast.USub) else inner
    raise ExpressionError(f"{type(node).__name__} is not allowed; use numbers and + - * / ( )")


_NUMBER = r"[-+]?\$?\s*\d[\d,]*(?:\.\d+)?|[-+]?\.\d+"
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*([^\n]*)", re.IGNORECASE)


def extract_number(text: str) -> Fraction | None:
    """The final numeric answer in model text, tolerant of formatting; None when absent.

    Looks, in order, at ``\\boxed{...}``, ``#### x``, ``<answer>x</answer>``,
    "the answer is x", then the last number in the text. Commas, currency signs, units,
    percent signs and a trailing period are ignored.
    """
    for pattern in (_BOXED, _HASHES, _ANSWER_TAG, _ANSWER_IS):
        matches = pattern.findall(text)
        if matches:
            number = _first_number(matches[-1])
            if number is not None:
                return number
    return _last_number(text)


_ONLY_NUMBER = re.compile(
    rf"\s*(?:<answer>\s*(?P<tag>{_NUMBER})\s*</answer>|(?:the\s+answer\s+is\s*:?\s*)?"
    rf"(?P<bare>{_NUMBER}))\s*\.?\s*", re.IGNORECASE)


def number_only(text: str) -> Fraction | None:
    """The reply as one number, or None when it holds anything else.

    Accepts "42", "42.", "<answer>42</answer>" and "The answer is 42."; refuses a number
    buried in other text, so that a broken tool call that happens to end in the right
    digit earns nothing (a lenient grader rewards such garbage and teaches it).
    """
    match = _ONLY_NUMBER.fullmatch(text)
    if match is None:
        return None
    return _to_fraction(match.group("tag") or match.group("bare"))


def _to_fraction(token: str) -> Fraction | None:
    cleaned = token.replace(",", "").replace("$", "").replace(" ", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _first_number(text: str) -> Fraction | None:
    match = re.search(_NUMBER, text)
    return _to_fraction(match.group(0)) if match else None


def _last_number(text: str) -> Fraction | None:
    matches = re.findall(_NUMBER, text)
    return _to_fraction(matches[-1]) if matches else None


def numbers_equal(predicted: Fraction | None, gold: Fraction, tolerance: float = 1e-6) -> bool:
    """Exact for integers, relative tolerance otherwise (answers like 0.3333333)."""
    if predicted is None:
        return False
    return abs(float(predicted) - float(gold)) <= tolerance * max(1.0, abs(float(gold)))


def last_tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` in the text, or None."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return found[-1] if found else None

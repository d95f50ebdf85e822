"""Deterministic verifier helpers shared by the built-in environments.

Arithmetic is parsed with ``ast`` against a whitelist of nodes and evaluated with exact
fractions: model text is never ``eval``-ed.
"""

from __future__ import annotations

import ast
import math
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
        if isinstance(node.value, float) and not math.isfinite(node.value):  # 1e999: inf
            raise ExpressionError(f"{node.value} is not a finite number")
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


MAX_EXAMINED_CHARS = 20_000
"""Verifiers read at most the last this-many characters of a reply (the answer is at its
end); with linear-time matching this bounds the time a reply of any length can take."""
MAX_NUMBER_CHARS = 100
"""A number written with more characters than this is not read as an answer (exact
arithmetic on it would be slow, and floats would overflow)."""
MAX_NUMBER_ONLY_CHARS = 400
"""``number_only``: a reply longer than this (after stripping) is not "a number alone"."""

# Every alternative starts with a sign, "$", a digit or ".", so a match attempt at any
# other character fails at once, and whitespace is only allowed in a bounded run after a
# sign or "$": matching is linear in the text (a leading \s* made it quadratic on spaces).
_NUMBER = r"(?:[-+]?\$\s{0,3}|[-+]\s{0,3})?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+"
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*([^\n]*)", re.IGNORECASE)


def extract_number(text: str) -> Fraction | None:
    """The final numeric answer in model text, tolerant of formatting; None when absent.

    Looks, in order, at ``\\boxed{...}``, ``#### x``, ``<answer>x</answer>``,
    "the answer is x", then the last number in the text. Commas, currency signs, units,
    percent signs and a trailing period are ignored. Only the last
    ``MAX_EXAMINED_CHARS`` characters are read.
    """
    text = text[-MAX_EXAMINED_CHARS:]
    for pattern in (_BOXED, _HASHES, None, _ANSWER_IS):
        if pattern is None:
            tagged = last_tagged(text)
            found = [] if tagged is None else [tagged]
        else:
            found = pattern.findall(text)
        if found:
            number = _first_number(found[-1])
            if number is not None:
                return number
    return _last_number(text)


_ONLY_NUMBER = re.compile(
    rf"(?:<answer>\s*(?P<tag>{_NUMBER})\s*</answer>|(?:the\s+answer\s+is\s*:?\s*)?"
    rf"(?P<bare>{_NUMBER}))\s*\.?", re.IGNORECASE)


def number_only(text: str) -> Fraction | None:
    """The reply as one number, or None when it holds anything else.

    Accepts "42", "42.", "<answer>42</answer>" and "The answer is 42."; refuses a number
    buried in other text, so that a broken tool call that happens to end in the right
    digit earns nothing (a lenient grader rewards such garbage and teaches it).
    """
    text = text.strip()
    if len(text) > MAX_NUMBER_ONLY_CHARS:
        return None
    match = _ONLY_NUMBER.fullmatch(text)
    if match is None:
        return None
    return _to_fraction(match.group("tag") or match.group("bare"))


def _to_fraction(token: str) -> Fraction | None:
    cleaned = token.replace(",", "").replace("$", "")
    cleaned = "".join(cleaned.split())  # the bounded whitespace after a sign or "$"
    if len(cleaned) > MAX_NUMBER_CHARS:
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _first_number(text: str) -> Fraction | None:
    match = re.search(_NUMBER, text)
    return _to_fraction(match.group(0)) if match else None


def _last_number(text: str) -> Fraction | None:
    last = None
    for last in re.finditer(_NUMBER, text):  # noqa: B007 - we want the last match
        pass
    return _to_fraction(last.group(0)) if last is not None else None


def numbers_equal(predicted: Fraction | None, gold: Fraction, tolerance: float = 1e-6) -> bool:
    """Exact for integers, relative tolerance otherwise (answers like 0.3333333).

    Compared in exact fractions, so no number can overflow a float.
    """
    if predicted is None:
        return False
    gold = Fraction(gold)
    return abs(predicted - gold) <= Fraction(tolerance) * max(Fraction(1), abs(gold))


def last_tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` in the text, or None.

    The last closing tag, and the last opening tag before it: with nested or repeated
    opening tags the innermost content wins (``<a><a>x</a>`` gives ``x``). Two ``rfind``
    and one ``find``: linear in the text whatever it holds.
    """
    text = text[-MAX_EXAMINED_CHARS:]
    opening, closing = f"<{tag}>", f"</{tag}>"
    end = text.rfind(closing)
    if end == -1:
        return None
    start = text.rfind(opening, 0, end)
    if start == -1:
        return None
    body = start + len(opening)
    return text[body: text.find(closing, body)]

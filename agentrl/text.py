"""Text that crosses a trust boundary (model output, tool output): valid UTF-8, bounded size.

Model text can hold anything a JSON string can encode, including lone UTF-16 surrogates
(``"\\ud800"``) that no tokenizer accepts; tool output can be arbitrarily long. These
helpers make such text safe to put into a context, in linear time.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
"""What a lone surrogate becomes (U+FFFD REPLACEMENT CHARACTER)."""


def is_valid_utf8(text: str) -> bool:
    """Whether the string encodes as UTF-8 (false exactly when it holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_utf8(text: str) -> str:
    """The text with every lone surrogate replaced by U+FFFD (a surrogate pair written as
    two code points becomes the character it encodes); unchanged when already valid."""
    if is_valid_utf8(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clip(text: str, max_chars: int, what: str = "text") -> str:
    """At most ``max_chars`` characters of the text (its head), with a marker saying how
    much was cut, so a reader (the model) knows it did not see everything."""
    if len(text) <= max_chars:
        return text
    kept = max_chars
    for _ in range(3):  # the marker's length depends on the count it names
        marker = f"\n[... {len(text) - kept} more characters of {what} cut]"
        kept = max(0, max_chars - len(marker))
    return text[:kept] + f"\n[... {len(text) - kept} more characters of {what} cut]"


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or "<unprintable>" when its ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return "<unprintable>"


def brief(message: str, max_chars: int = 300) -> str:
    """An exception's message as one line of about ``max_chars`` characters, for the
    one-line failure reason (the traceback keeps the whole of it)."""
    flat = " ".join(message.split())
    return flat if len(flat) <= max_chars else f"{flat[:max_chars]}... ({len(flat)} characters)"


def short_repr(value: object, max_chars: int = 80) -> str:
    """``repr`` of a value for an error message, cut to about ``max_chars`` characters
    (never raises: an int too long to print is named by its type)."""
    if isinstance(value, str) and len(value) > max_chars:
        return repr(value[:max_chars]) + f"... ({len(value)} characters)"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. ValueError for an int past 4300 digits
        return f"<{type(value).__name__} that cannot be printed>"
    return text if len(text) <= 2 * max_chars else text[: 2 * max_chars] + "..."

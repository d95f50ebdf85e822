"""Declared ranges of config fields: msgspec ``Meta`` bounds, checked with a one-line fix.

A field's range is part of its type (``top_p: Probability``), so it documents itself
(``msgspec.json.schema(Config)`` shows it) and msgspec enforces it on decode. On top of
the bounds, every float setting must be finite: TOML accepts ``inf`` and ``nan``, and no
setting means anything at infinity. :func:`check_ranges` walks a raw config (or a
Config turned into builtins) and raises a :class:`ConfigError` of one line naming the
setting, the value, the allowed range and the fix. ``Meta(extra={"fix": ...})`` on a
field replaces the generic fix with a specific one.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Annotated, Any

import msgspec
from msgspec import Meta


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the setting and the fix."""


PositiveInt = Annotated[int, Meta(ge=1)]
"""A count or budget: at least 1 (0 would silently do nothing)."""
NonNegativeInt = Annotated[int, Meta(ge=0)]
"""An interval or count where 0 has a documented meaning (usually "off")."""
PositiveFloat = Annotated[float, Meta(gt=0)]
"""A finite number above 0: timeouts, learning rates, weights, scales."""
NonNegativeFloat = Annotated[float, Meta(ge=0)]
"""A finite number, 0 allowed (usually "off")."""
Probability = Annotated[float, Meta(gt=0, le=1)]
"""A probability mass that must keep something: (0, 1]."""
UnitInterval = Annotated[float, Meta(ge=0, lt=1)]
"""Clip bounds and Adam betas: [0, 1)."""


def fix(text: str) -> Meta:
    """A field-specific fix for the range message: ``Annotated[PositiveInt, fix("...")]``."""
    return Meta(extra={"fix": text})


def check_ranges(raw: Any, struct_type: type, where: str = "") -> None:
    """Refuse any value of ``raw`` (plain dicts/lists) outside its field's declared range.

    Values of the wrong type are left to msgspec, which names the expected type.
    """
    if not isinstance(raw, dict):
        return
    hints = typing.get_type_hints(struct_type, include_extras=True)
    defaults = {f.name: f.default for f in msgspec.structs.fields(struct_type)}
    for key, value in raw.items():
        if key in hints:
            _check_value(value, hints[key], f"{where}{key}", defaults.get(key))


def _check_value(value: Any, annotation: Any, setting: str, default: Any) -> None:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        base, metas = args[0], [m for m in args[1:] if isinstance(m, Meta)]
        if _is_number(value) and not _within(value, metas, base is float):
            raise ConfigError(_message(setting, value, metas, base is float, default))
        _check_value(value, base, setting, default)
    elif annotation is float and _is_number(value) and not math.isfinite(value):
        raise ConfigError(_message(setting, value, [], True, default))
    elif origin in (types.UnionType, typing.Union) and value is not None:
        for arg in args:
            if arg is not type(None):
                _check_value(value, arg, setting, default)
    elif origin is list and isinstance(value, list):
        for index, item in enumerate(value):
            _check_value(item, args[0], f"{setting}[{index}]", None)
    elif origin is tuple and isinstance(value, list | tuple):
        defaults = default if isinstance(default, tuple) else (None,) * len(args)
        for index, (item, arg) in enumerate(zip(value, args, strict=False)):
            _check_value(item, arg, f"{setting}[{index}]", defaults[index])
    elif isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        check_ranges(value, annotation, f"{setting}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _within(value: float, metas: list[Meta], is_float: bool) -> bool:
    if is_float and not math.isfinite(value):
        return False
    for meta in metas:
        if meta.gt is not None and not value > meta.gt:
            return False
        if meta.ge is not None and not value >= meta.ge:
            return False
        if meta.lt is not None and not value < meta.lt:
            return False
        if meta.le is not None and not value <= meta.le:
            return False
    return True


def describe_range(metas: list[Meta], is_float: bool) -> str:
    """The range in words: "a finite number in (0, 1]", "an integer >= 1"."""
    low = next(((m.gt, "(") for m in metas if m.gt is not None), None) or next(
        ((m.ge, "[") for m in metas if m.ge is not None), None)
    high = next(((m.lt, ")") for m in metas if m.lt is not None), None) or next(
        ((m.le, "]") for m in metas if m.le is not None), None)
    kind = "a finite number" if is_float else "an integer"
    if low and high:
        return f"{kind} in {low[1]}{_number(low[0])}, {_number(high[0])}{high[1]}"
    if low:
        return f"{kind} {'>' if low[1] == '(' else '>='} {_number(low[0])}"
    if high:
        return f"{kind} {'<' if high[1] == ')' else '<='} {_number(high[0])}"
    return kind


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _message(setting: str, value: Any, metas: list[Meta], is_float: bool, default: Any) -> str:
    hints = [m.extra["fix"] for m in metas if m.extra and "fix" in m.extra]
    advice = hints[0] if hints else "set it within that range"
    if default is None:
        advice += " (default: unset, i.e. leave it out)"
    elif default is not msgspec.NODEFAULT:
        advice += f" (default {default!r})"
    return (f"{setting} = {value!r} is out of range: it must be "
            f"{describe_range(metas, is_float)}; {advice}")

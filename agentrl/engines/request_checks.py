"""Checks every server runs on a request before it costs anything: numbers finite and in
range, stop strings non-empty, nesting depth bounded, weight-push messages matching the
served model. Each raises ValueError naming the field and what it accepts (the servers
answer it with a 4xx and go on)."""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting of lists and objects a request (or a tool call's arguments) may have."""
MAX_STOP = 16
"""Stop strings per request."""
MAX_STOP_CHARS = 1000
"""Characters per stop string."""
MAX_SEED = 2**63 - 1
MAX_TOKENS = 2**31 - 1
MAX_SYNC_TIMEOUT_S = 86400.0
"""Longest rendezvous/broadcast timeout a weight push may ask the replica to wait."""
DTYPES = ("float32", "float16", "bfloat16", "float64")
"""dtypes a weight push may send."""

_RANGES: dict[str, tuple[float, float]] = {
    "max_tokens": (1, MAX_TOKENS), "max_completion_tokens": (1, MAX_TOKENS),
    "seed": (-MAX_SEED, MAX_SEED), "temperature": (0.0, 100.0), "top_p": (0.0, 1.0),
}
"""Accepted (lowest, highest) of each number a request may carry."""


def number(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """``body[name]`` as ``kind`` (int or float), or ``default`` when absent or null;
    ValueError for a bool, a string, NaN, an infinity, a fraction where an int is asked,
    or a value outside the field's range."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{name!r} must be a finite number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"{name!r} must be an integer, got {value!r}")
    low, high = _RANGES.get(name, (-math.inf, math.inf))
    if not low <= value <= high:
        raise ValueError(f"{name!r} = {value!r} is out of range [{low:g}, {high:g}]")
    return kind(value)


def stop_strings(value: Any) -> tuple[str, ...]:
    """A request's ``stop`` (a string or a list of strings) as a tuple; ValueError for an
    empty string (it would match everywhere), more than MAX_STOP, or a long one."""
    stops = () if value is None else (value,) if isinstance(value, str) else value
    if not (isinstance(stops, list | tuple) and all(isinstance(s, str) for s in stops)):
        raise ValueError("'stop' must be a string or a list of strings")
    if len(stops) > MAX_STOP or any(not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise ValueError(f"'stop' takes at most {MAX_STOP} strings of 1 to "
                         f"{MAX_STOP_CHARS} characters (an empty one would stop everywhere)")
    return tuple(stops)


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """ValueError when lists/objects in ``value`` nest deeper than ``limit`` (iterative:
    a deep value cannot exhaust the stack here)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        if depth > limit:
            raise ValueError(f"{what} nests deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children)


def check_init_info(info: Any) -> dict[str, Any]:
    """An ``init_weight_transfer_engine`` message's ``init_info``, checked: an address, a
    port, rank offset, world size, and a timeout the replica can wait."""
    if not isinstance(info, dict):
        raise ValueError("init_weight_transfer_engine needs {'init_info': {...}}")
    address, port = info.get("master_address"), info.get("master_port")
    if not isinstance(address, str) or not address or len(address) > 255:
        raise ValueError("init_info.master_address must be a host name or address")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"init_info.master_port must be a TCP port, got {port!r}")
    for name, low, high in (("rank_offset", 1, 1), ("world_size", 2, 2)):
        value = info.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"init_info.{name} must be {low} for this one-worker replica, "
                             f"got {value!r}")
    timeout = info.get("timeout_s", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            0 < timeout <= MAX_SYNC_TIMEOUT_S):
        raise ValueError(f"init_info.timeout_s must be in (0, {MAX_SYNC_TIMEOUT_S:g}] s")
    return info


def check_update_info(info: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """An ``update_weights`` message's ``update_info``, checked against the served
    model's tensors (``shapes``: name → shape) before any byte is received: known names,
    exact shapes, float dtypes, each name once."""
    if not isinstance(info, dict):
        raise ValueError("update_weights needs {'update_info': {names, dtype_names, shapes}}")
    names, dtypes, sizes = info.get("names"), info.get("dtype_names"), info.get("shapes")
    if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(sizes, list)
            and len(names) == len(dtypes) == len(sizes) and names):
        raise ValueError("update_info needs names, dtype_names and shapes: equal-length, "
                         "non-empty lists")
    if len(set(map(str, names))) != len(names):
        raise ValueError("update_info names a tensor twice")
    for name, dtype, shape in zip(names, dtypes, sizes, strict=True):
        if not isinstance(name, str) or name not in shapes:
            raise ValueError(f"update_info: {str(name)[:80]!r} is not a tensor of the "
                             "served model")
        if dtype not in DTYPES:
            raise ValueError(f"update_info: {name} has dtype {str(dtype)[:20]!r}; use one "
                             f"of {DTYPES}")
        if not isinstance(shape, list) or tuple(shape) != shapes[name]:
            raise ValueError(f"update_info: {name} has shape {str(shape)[:40]}, the served "
                             f"model's is {list(shapes[name])}")

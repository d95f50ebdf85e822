"""Loading a run configuration: TOML, ``section.key=value`` overrides, decoding, checks.

Unknown keys are refused with the closest valid name, ranges before msgspec decodes (its
own message names no fix), then the load-time checks of ``agentrl.config.checks``.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from agentrl.config.checks import validate
from agentrl.config.ranges import ConfigError, check_ranges
from agentrl.config.settings import Config


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file, apply ``section.key=value`` overrides, decode and validate."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    for override in overrides:
        apply_override(raw, override)
    resolve_env_files(raw, path.parent)
    return config_from_dict(raw, source=str(path))


def resolve_env_files(raw: dict[str, Any], config_dir: Path) -> None:
    """An environment id "file.py:Class" names a file relative to where agentrl runs, or
    else relative to the config file's folder: such ids get that folder's path, so a
    config beside its environment file runs from anywhere (also a harness's ``run`` and
    ``grader``)."""
    for env in raw.get("environments") or []:
        env_id = env.get("id") if isinstance(env, dict) else None
        if isinstance(env_id, str):
            env["id"] = _beside(env_id, config_dir)
        harness = env.get("harness") if isinstance(env, dict) else None
        for key in ("run", "grader"):  # a harness's callables name files the same way
            if isinstance(harness, dict) and isinstance(harness.get(key), str):
                harness[key] = _beside(harness[key], config_dir)


def _beside(target: str, config_dir: Path) -> str:
    """"file.py:name" with the config's folder prepended when the file is only there."""
    if ".py:" not in target:
        return target
    file, _, name = target.rpartition(":")
    beside = config_dir / file
    if not Path(file).is_absolute() and not Path(file).exists() and beside.exists():
        return f"{beside}:{name}"
    return target


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Config:
    """Decode a plain dict into a validated Config."""
    check_unknown_keys(raw, Config, "")
    check_ranges(raw, Config)  # before msgspec, whose own range message names no fix
    try:
        config = msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    validate(config)
    return config


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one ``a.b.c=value`` to a raw dict; the value is read as TOML, else as a string.

    A numeric part indexes a list: ``environments.0.weight=2``.
    """
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    dotted, _, text = override.partition("=")
    keys = dotted.strip().split(".")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    node: Any = raw
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, key, dotted)]
        else:
            node = node.setdefault(key, {})
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(node, last, dotted)] = value
    else:
        node[last] = value


def _list_index(node: list[Any], key: str, dotted: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ConfigError(f"override {dotted}: {key!r} is not an index below {len(node)}")
    return int(key)


def check_unknown_keys(raw: Any, struct_type: type, where: str) -> None:
    """Refuse keys that are not fields, naming the key and the closest valid one."""
    if not isinstance(raw, dict):
        return
    hints = typing.get_type_hints(struct_type)
    fields = [f.name for f in msgspec.structs.fields(struct_type)]
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean '{where}{close[0]}'?" if close else ""
            valid = ", ".join(fields)
            raise ConfigError(
                f"unknown setting '{where}{key}'{hint} (valid keys here: {valid})"
            )
        inner = _struct_inside(hints[key])
        if inner is None:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                check_unknown_keys(item, inner, f"{where}{key}[{i}].")
        else:
            check_unknown_keys(value, inner, f"{where}{key}.")


def _struct_inside(annotation: Any) -> type | None:
    """The Struct type held by an annotation (directly, in a list, or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    if typing.get_origin(annotation) in (list, types.UnionType, typing.Union):
        for arg in typing.get_args(annotation):
            found = _struct_inside(arg)
            if found is not None:
                return found
    return None

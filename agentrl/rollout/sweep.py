"""Evaluation beyond the training length: held-out accuracy over a grid of settings.

``agentrl eval CONFIG --checkpoint C --sweep KEY=V1,V2,...`` evaluates one checkpoint at
every *cell* of the grid the ``--sweep`` flags span (several flags: their product). A KEY
is a keyword argument of the config's environments (Ledger's ``num_pages``, ...) or one
of :data:`COMPACTION_KEYS`. Each cell is played by the policy as configured and, beside
it, by the *baselines* (:data:`BASELINES`): the same checkpoint with ``drop_oldest``
compaction, and with the full context (no budget). Every (cell, method, environment)
gets its accuracy on the same held-out tasks with a 95% Wilson interval, and the
compaction figures of :mod:`agentrl.observe.compaction` (compact calls per rollout,
forced compactions, fact survival when the environment names its facts), so a policy
that stops compacting at test length shows it.

Everything is checked before anything is played: an unknown KEY, or a value an
environment or the compaction settings refuse, is a one-line :class:`ConfigError` (a
``ValueError``) naming the key and what is valid.
"""

from __future__ import annotations

import inspect
import itertools
import math
import tomllib
import typing
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec

from agentrl.config import CompactionConfig, Config, ConfigError, EnvironmentConfig
from agentrl.config.load import check_ranges
from agentrl.observe.compaction import compaction_figures
from agentrl.rollout.evaluation import eval_rollouts, is_correct, make_env
from agentrl.types import Rollout

COMPACTION_KEYS = ("compaction.max_context_tokens", "compaction.max_compactions",
                   "compaction.strategy")
"""The compaction settings a sweep may vary (besides environment keywords)."""
BASELINES = {"drop_oldest": "drop_oldest", "full": "none"}
"""Baseline method -> the compaction strategy it plays: old turns dropped at the same
budget, and the full context (no budget: one row up to the model's positions)."""
POLICY = "policy"
"""The method of the config as it is (its own compaction strategy)."""
Z_95 = 1.959964
"""The normal quantile of a two-sided 95% interval."""


class SweepAxis(msgspec.Struct, frozen=True):
    """One ``--sweep KEY=V1,V2,...``: a key and the values it takes."""

    key: str
    values: tuple[Any, ...]


class Setting(msgspec.Struct, frozen=True):
    """One configuration to evaluate: a cell of the grid, played by one method."""

    cell: dict[str, Any]
    """Sweep key -> value, in the order of the ``--sweep`` flags."""
    method: str
    """:data:`POLICY` or a key of :data:`BASELINES`."""
    config: Config


class CellResult(msgspec.Struct):
    """Held-out figures of one environment under one :class:`Setting`."""

    cell: dict[str, Any]
    method: str
    env: str
    num_tasks: int
    num_correct: int
    accuracy: float
    low: float
    """Lower end of the 95% Wilson interval of ``accuracy``."""
    high: float
    compact_calls: float
    """``compact`` calls per rollout (the policy's own compactions)."""
    forced_compactions: float
    """Compactions per rollout the budget forced."""
    fact_survival: float | None
    """Share of the needed facts seen before a compaction that it kept (None: the
    environment names none, or nothing was compacted)."""
    truncated: float
    """Share of rollouts that ended truncated."""
    truncation_reason: str | None
    """The most common reason among them (``rollout.max_turns`` too low for a long task
    shows here as ``max_turns``)."""
    invalid: float
    """Share of rollouts that were invalid (counted wrong)."""
    invalid_reason: str | None
    """The most common kind among them (``engine_refused``: a context past the model's
    positions, as the full-context baseline meets on long tasks)."""


def parse_sweep(text: str) -> SweepAxis:
    """``KEY=V1,V2,...``; each value read as TOML (``12``, ``"tool"``), else as a string."""
    key, sep, values = text.partition("=")
    parts = [v.strip() for v in values.split(",")]
    if not sep or not key.strip() or not all(parts):
        raise ConfigError(f"--sweep {text!r} must look like KEY=V1,V2,... (e.g. "
                          "num_pages=6,12,24 or compaction.strategy=tool,drop_oldest)")
    return SweepAxis(key.strip(), tuple(_value(v) for v in parts))


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def wilson_interval(num_correct: int, num_tasks: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default): unlike the
    normal approximation it stays inside [0, 1] and is not empty at 0 or n successes."""
    if num_tasks == 0:
        return 0.0, 1.0
    p, n = num_correct / num_tasks, num_tasks
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # the bounds hold the estimate itself, rounding included (1.0 at n of n, 0.0 at none)
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))


def env_keywords(env_config: EnvironmentConfig) -> list[str]:
    """The keyword arguments an environment's constructor takes (its own and, through
    ``**kwargs``, its base classes')."""
    env = make_env(env_config)
    _close(env)
    names: set[str] = set()
    for klass in type(env).__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        params = inspect.signature(init).parameters.values()
        names.update(p.name for p in params if p.name != "self" and p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return sorted(names)


def plan_sweep(config: Config, axes: Sequence[SweepAxis],
               baselines: Sequence[str] = tuple(BASELINES)) -> tuple[list[Setting], list[str]]:
    """Every (cell, method) to evaluate, each checked, and the environments left out
    (those that take none of the swept environment keywords). Baselines that would
    repeat a configuration already planned (sweeping the strategy itself) are left out."""
    for name in baselines:
        if name not in BASELINES:
            raise ConfigError(f"--baselines {name!r} is not a baseline; valid: "
                              f"{', '.join(BASELINES)} (or none)")
    keywords = {env.display_name(): env_keywords(env) for env in config.environments}
    env_keys = [a.key for a in axes if a.key not in COMPACTION_KEYS]
    _check_keys(axes, keywords)
    kept = [env for env in config.environments
            if all(k in keywords[env.display_name()] for k in env_keys)]
    left_out = [env.display_name() for env in config.environments if env not in kept]
    if not kept:
        raise ConfigError(f"--sweep {', '.join(env_keys)}: no environment takes all of these "
                          "keywords; sweep them one environment config at a time")
    planned = []
    for values in itertools.product(*(a.values for a in axes)):
        cell = dict(zip((a.key for a in axes), values, strict=True))
        environments = [_with_kwargs(env, cell, env_keys) for env in kept]
        for method in (POLICY, *baselines):
            compaction = _compaction(config.compaction, cell, method)
            planned.append((_identity(environments, compaction), Setting(
                cell, method, msgspec.structs.replace(
                    config, environments=environments, compaction=compaction))))
    # a baseline the grid itself plays (a swept strategy) is that cell's policy row
    policy = {identity for identity, s in planned if s.method == POLICY}
    settings, seen = [], set()
    for identity, setting in planned:
        if setting.method == POLICY or (identity not in policy and identity not in seen):
            seen.add(identity)
            settings.append(setting)
    return settings, left_out


def _check_keys(axes: Sequence[SweepAxis], keywords: dict[str, list[str]]) -> None:
    """Refuse a key that is neither a compaction key nor any environment's keyword."""
    known = {k for names in keywords.values() for k in names}
    for axis in axes:
        if axis.key not in COMPACTION_KEYS and axis.key not in known:
            envs = "; ".join(f"{env}: {', '.join(names)}" for env, names in keywords.items())
            raise ConfigError(f"--sweep {axis.key}: unknown key; valid: "
                              f"{', '.join(COMPACTION_KEYS)}, or an environment keyword "
                              f"({envs})")
    if len({a.key for a in axes}) != len(axes):
        raise ConfigError("--sweep names the same key twice; give each key one --sweep")


def _with_kwargs(env: EnvironmentConfig, cell: dict[str, Any],
                 env_keys: list[str]) -> EnvironmentConfig:
    """The environment with the cell's keywords, built once to check them."""
    changed = {k: cell[k] for k in env_keys}
    if not changed:
        return env
    entry = msgspec.structs.replace(env, kwargs={**env.kwargs, **changed})
    try:
        _close(make_env(entry))
    except Exception as exc:  # noqa: BLE001 - any refusal is the value's fault here
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--sweep {', '.join(f'{k}={v!r}' for k, v in changed.items())}: "
                          f"environment {env.display_name()!r} refuses it: {detail}") from None
    return entry


def _compaction(base: CompactionConfig, cell: dict[str, Any], method: str) -> CompactionConfig:
    """The cell's compaction settings under ``method``, checked like a config file's."""
    raw = msgspec.to_builtins(base)
    for key, value in cell.items():
        if key in COMPACTION_KEYS:
            raw[key.removeprefix("compaction.")] = value
    if method != POLICY:
        raw["strategy"] = BASELINES[method]
    hints = typing.get_type_hints(CompactionConfig)
    for key in COMPACTION_KEYS:
        field = key.removeprefix("compaction.")
        choices = typing.get_args(hints[field])
        if typing.get_origin(hints[field]) is typing.Literal and raw[field] not in choices:
            raise ConfigError(f"--sweep {key}: {raw[field]!r} is not valid; valid: "
                              f"{', '.join(choices)}")
    try:
        check_ranges(raw, CompactionConfig)
        return msgspec.convert(raw, CompactionConfig, strict=False)
    except (ValueError, msgspec.ValidationError) as exc:
        swept = [k for k in cell if k in COMPACTION_KEYS]
        raise ConfigError(f"--sweep {', '.join(swept) or 'compaction'}: "
                          f"{str(exc).splitlines()[0]}") from None


def _identity(environments: list[EnvironmentConfig], compaction: CompactionConfig) -> bytes:
    """What makes two settings play the same rollouts: their environments and compaction
    (the full-context baseline is still played at every swept budget, so its curve is
    drawn across them)."""
    return msgspec.json.encode([environments, compaction])


def trained_value(config: Config, key: str) -> Any:
    """The value of ``key`` in the config as trained (None when it does not say): the
    point on the x axis where the curve's training length lies."""
    if key in COMPACTION_KEYS:
        return getattr(config.compaction, key.removeprefix("compaction."))
    values = {env.kwargs[key] for env in config.environments if key in env.kwargs}
    return values.pop() if len(values) == 1 else None


async def evaluate_setting(engine: Any, tokenizer: Any, setting: Setting, num_tasks: int,
                           temperature: float = 0.0) -> list[CellResult]:
    """Play ``num_tasks`` held-out tasks of each environment under one setting."""
    rollouts = await eval_rollouts(engine, tokenizer, setting.config, num_tasks, temperature)
    return [cell_result(setting, env.display_name(),
                        [r for r in rollouts if r.env == env.display_name()])
            for env in setting.config.environments]


def cell_result(setting: Setting, env: str, rollouts: list[Rollout]) -> CellResult:
    """Accuracy with its interval and the compaction figures of one environment's
    held-out rollouts under ``setting``."""
    correct = int(sum(is_correct(r) for r in rollouts))
    n = len(rollouts)
    low, high = wilson_interval(correct, n)
    figures = compaction_figures(rollouts) if rollouts else {}
    truncated = share_and_reason(
        [r.stats.truncation_reason or "unknown" for r in rollouts if r.stats.truncated], n)
    invalid = share_and_reason(
        [r.stats.error_kind or "unknown" for r in rollouts if not r.trainable], n)
    return CellResult(
        cell=setting.cell, method=setting.method, env=env, num_tasks=n, num_correct=correct,
        accuracy=correct / n if n else 0.0, low=low, high=high,
        compact_calls=figures.get("compaction/by_tool/mean", 0.0),
        forced_compactions=figures.get("compaction/by_budget/mean", 0.0),
        fact_survival=figures.get("compaction/fact_survival"),
        truncated=truncated[0], truncation_reason=truncated[1],
        invalid=invalid[0], invalid_reason=invalid[1])


def share_and_reason(reasons: list[str], num_rollouts: int) -> tuple[float, str | None]:
    """The share of ``num_rollouts`` that ``reasons`` holds, and its most common reason."""
    if not reasons:
        return 0.0, None
    return len(reasons) / num_rollouts, Counter(reasons).most_common(1)[0][0]


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()

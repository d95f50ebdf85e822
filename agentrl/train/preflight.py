"""Plan-time checks: what a config needs from the world, verified before anything launches.

`agentrl plan` and `agentrl train` (before it spawns or loads anything) run every check
in :data:`CHECKS` on one :class:`Preflight`, which builds what the checks share once, on
first use: each environment (id, keyword arguments, data files), the model folder's
``config.json`` and the tokenizer. Never the weights, so the checks take about a second.

A check is a function ``(Preflight) -> str``: it returns one line for the plan's output
or raises :class:`ConfigError` with one line naming the setting and the fix. Every check
runs even when an earlier one failed, and every failure is reported, one line each. A
new check is a function appended to ``CHECKS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentrl.config import Config, ConfigError
from agentrl.train.preflight_facts import Preflight
from agentrl.train.preflight_parts import (
    check_chat_template,
    check_environments,
    check_harnesses,
    check_lora,
    check_model,
    check_trackers,
)
from agentrl.train.preflight_sizes import (
    check_compact_tool,
    check_context_budget,
    check_micro_batch_budget,
    check_positions,
    check_threads,
)

Check = Callable[[Preflight], str]


CHECKS: list[Check] = [check_environments, check_harnesses, check_model, check_chat_template,
                       check_positions,
                       check_micro_batch_budget, check_context_budget, check_compact_tool,
                       check_threads, check_trackers, check_lora]
"""The plan-time checks, in order."""


def run_checks(config: Config, checks: Sequence[Check] = CHECKS) -> list[str]:
    """Run every check; return their lines, or raise one ConfigError holding every
    failure (one line each, each named once)."""
    pf = Preflight(config)
    lines: list[str] = []
    failures: dict[str, None] = {}
    try:
        for check in checks:
            try:
                lines.append(check(pf))
            except ConfigError as exc:
                failures.update(dict.fromkeys(str(exc).splitlines()))
    finally:
        pf.close()
    if failures:
        raise ConfigError("\n".join(failures))
    return lines

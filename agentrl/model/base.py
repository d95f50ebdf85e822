"""Where the generic base model lives: the default starting point of ``agentrl sft``."""

from __future__ import annotations

from pathlib import Path

GENERIC_BASE = Path(__file__).resolve().parents[2] / "assets" / "base"
"""``assets/base`` of the source tree: built by ``agentrl sft configs/base.toml --base new``
from the curriculum of :mod:`agentrl.curriculum.drills`."""


def generic_base() -> Path:
    """The generic base's folder; a one-line error naming the fix when it is missing (an
    install without the repository's ``assets/``)."""
    from agentrl.config import ConfigError

    if not (GENERIC_BASE / "config.json").is_file():
        raise ConfigError(f"the generic base {GENERIC_BASE} is missing (agentrl installed "
                          f"without its assets/?): pass --base DIR, or --base new for a new "
                          f"tiny model")
    return GENERIC_BASE

"""Which rollout an engine request belongs to: one key format for every request.

A request's key is its rollout's id for the main thread, ``<rollout id>#<part>`` for the
rest: a subagent thread's id (``2.1``), or ``session-<secret>`` for an agent program's
session (its API key). The router keeps each key on one replica (its prefix cache), and
the demonstration engine reads the rollout and the thread back from it.
"""

from __future__ import annotations

import secrets

from agentrl.types import MAIN_THREAD

SEPARATOR = "#"
SESSION_PREFIX = "session-"
"""How the part of an agent program's session key begins."""


def request_key(rollout_id: str, part: str) -> str:
    """The key of a rollout's requests: the rollout id for ``MAIN_THREAD``, else
    ``<rollout id>#<part>``."""
    return rollout_id if part == MAIN_THREAD else f"{rollout_id}{SEPARATOR}{part}"


def split_key(key: str) -> tuple[str, str]:
    """``(rollout id, part)`` of a key made by :func:`request_key` (``MAIN_THREAD`` for a
    bare rollout id)."""
    rollout_id, separator, part = key.rpartition(SEPARATOR)
    return (rollout_id, part) if separator else (key, MAIN_THREAD)


def new_session_key(rollout_id: str) -> str:
    """A fresh, unguessable session key of an agent program playing ``rollout_id``."""
    return request_key(rollout_id, SESSION_PREFIX + secrets.token_hex(8))


def is_session(part: str) -> bool:
    """Whether a key's part (:func:`split_key`) names an agent program's session."""
    return part.startswith(SESSION_PREFIX)

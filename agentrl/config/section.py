"""The base of every config section Struct."""

from __future__ import annotations

import msgspec


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: unknown keys are refused."""

"""Saving and loading a collected batch of rollouts as msgspec JSON (for ``agentrl inspect``)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agentrl.types import Rollout


class SavedBatch(msgspec.Struct):
    """A batch on disk: the rollouts, in collection order."""

    rollouts: list[Rollout]
    step: int | None = None


def save_batch(path: str | Path, rollouts: list[Rollout], step: int | None = None) -> Path:
    """Write rollouts to ``path`` as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(SavedBatch(list(rollouts), step)))
    return path


def load_batch(path: str | Path) -> list[Rollout]:
    """Read rollouts written by ``save_batch``; ValueError naming the file if it is not one."""
    path = Path(path)
    try:
        return msgspec.json.decode(path.read_bytes(), type=SavedBatch).rollouts
    except FileNotFoundError:
        raise ValueError(f"batch file {path} does not exist") from None
    except msgspec.DecodeError as exc:
        raise ValueError(
            f"{path} is not a batch written by save_batch ({exc}); write one with "
            "`agentrl inspect --demo --save PATH`"
        ) from None

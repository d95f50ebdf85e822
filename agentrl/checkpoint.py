"""Checkpoints of a training run: written atomically, resumed exactly.

Layout of ``RUN_DIR/checkpoints/step_N/``::

    config.json, model.safetensors, tokenizer.json, ...   the policy in Hugging Face format
                                                          (loadable by transformers and vLLM)
    trainer_state.json   step and cumulative counters, sampler and RNG state (python, numpy)
    optimizer.pt         AdamW state, scheduler state, torch RNG state

A checkpoint is written into a temporary folder next to its final place and renamed once
complete, so a run killed mid-write leaves the previous checkpoints intact and at most a
``.tmp-*`` folder, which :func:`latest_checkpoint` ignores and
:func:`remove_stale_temp_folders` deletes when the run is resumed.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


class TrainerState(msgspec.Struct, kw_only=True):
    """Counters and RNG state that, with the weights and optimizer, make a resume exact."""

    step: int = 0
    """Training steps (collections + their updates) completed."""
    num_updates: int = 0
    """Optimizer updates completed."""
    cumulative_rollouts: int = 0
    """Rollouts collected so far (training only, validations excluded)."""
    cumulative_tokens: int = 0
    """Tokens sampled from the policy so far."""
    cumulative_active_s: float = 0.0
    """Seconds spent in generate, train and sync phases so far (for time-to-target)."""
    sampler: dict[str, Any] = {}
    python_rng: list[Any] = []
    numpy_rng: dict[str, Any] = {}


def step_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{step}"


def capture_rng(state: TrainerState) -> None:
    """Store the python and numpy global RNG states into ``state`` (torch's goes in .pt)."""
    version, internal, gauss = random.getstate()
    state.python_rng = [version, list(internal), gauss]
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    state.numpy_rng = np_state


def restore_rng(state: TrainerState) -> None:
    """Put the python and numpy global RNGs back where :func:`capture_rng` found them."""
    if state.python_rng:
        version, internal, gauss = state.python_rng
        random.setstate((version, tuple(internal), gauss))
    if state.numpy_rng:
        np_state = dict(state.numpy_rng)
        np_state["state"] = dict(np_state["state"])
        np_state["state"]["key"] = np.asarray(np_state["state"]["key"], dtype=np.uint32)
        np.random.set_state(np_state)


def save_checkpoint(
    run_dir: str | Path,
    state: TrainerState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Write ``step_<state.step>`` atomically and return its path.

    ``tokenizer_dir`` is the folder the model was loaded from: its tokenizer files are
    copied so that the checkpoint is a complete Hugging Face folder.
    """
    from agentrl.model import save_pretrained

    final = step_dir(run_dir, state.step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{state.step}-", dir=final.parent))
    try:
        save_pretrained(model, tmp)
        copy_tokenizer_files(tokenizer_dir, tmp)
        capture_rng(state)
        (tmp / STATE_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(state)))
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "torch_rng": torch.get_rng_state(),
            },
            tmp / OPTIMIZER_FILE,
        )
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def copy_tokenizer_files(src: str | Path | None, dst: Path) -> None:
    """Copy the tokenizer files of a model folder next to saved weights (a complete HF
    folder needs both)."""
    if src is None:
        return
    for name in TOKENIZER_FILES:
        path = Path(src) / name
        if path.exists() and not (dst / name).exists():
            shutil.copy2(path, dst / name)


def _fsync_dir(path: Path) -> None:
    """Flush file contents before the rename, so a crash cannot expose a half-written file."""
    for child in path.iterdir():
        if child.is_file():
            with open(child, "rb") as handle:
                os.fsync(handle.fileno())


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first; temp folders skipped."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        name = path.name
        if name.startswith("step_") and name[5:].isdigit() and (path / STATE_FILE).exists():
            found.append((int(name[5:]), path))
    return sorted(found)


def remove_stale_temp_folders(run_dir: str | Path) -> list[Path]:
    """Delete the ``.tmp-step_*`` folders killed runs left in ``RUN_DIR/checkpoints`` and
    return them. Call it only while nothing writes checkpoints into this run (start-up)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    stale = sorted(root.glob(".tmp-step_*")) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def read_state(path: str | Path) -> TrainerState:
    """The counters of a checkpoint, without touching weights."""
    return msgspec.json.decode((Path(path) / STATE_FILE).read_bytes(), type=TrainerState)


def load_training_state(
    path: str | Path, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Restore optimizer, scheduler and every RNG from a checkpoint; return its counters.

    The weights are loaded separately (the model is built from the checkpoint folder with
    ``agentrl.model.load_pretrained``), so this never holds two copies of the model.
    """
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise ValueError(
            f"{path} is not a complete agentrl checkpoint (no {STATE_FILE}); pass a "
            f"RUN_DIR/{CHECKPOINT_DIR}/step_N folder"
        )
    state = read_state(path)
    blob = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["torch_rng"])
    restore_rng(state)
    return state

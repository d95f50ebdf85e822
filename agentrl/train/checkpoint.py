"""Checkpoints of a training run: written atomically, resumed exactly.

Layout of ``RUN_DIR/checkpoints/step_N/``::

    config.json, model.safetensors, tokenizer.json, ...   the policy's fp32 master weights
                                                          in Hugging Face format (loadable
                                                          by transformers and vLLM)
      or, with [model.lora]: adapter_config.json,       the adapter alone (fp32) in PEFT's
      adapter_model.safetensors, tokenizer.json, ...    format; the base stays in its folder
    trainer_state.json   step and cumulative counters, sampler and RNG state (python, numpy)
    optimizer/           AdamW state as each rank's shards (torch.distributed.checkpoint);
                         a resume may use another rank count (DCP reshards)
    trainer.pt           scheduler state, torch RNG state

Saving is collective: every rank gathers the weights to rank 0 and writes its own optimizer
shard; rank 0 writes the rest. Several machines therefore need the run folder on a shared
filesystem to checkpoint and resume. A checkpoint is written into a temporary folder next
to its final place and renamed once complete, so a run killed mid-write leaves the
previous checkpoints intact and at most a ``.tmp-*`` folder, which
:func:`latest_checkpoint` ignores and
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
OPTIMIZER_DIR = "optimizer"
TRAINER_FILE = "trainer.pt"
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
    cumulative_cost: float = 0.0
    """Cost of the steps so far under the price table ``log.costs`` (0 without one)."""
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
    lora: Any = None,
) -> Path:
    """Write ``step_<state.step>`` atomically (collective: call on every rank); returns it.

    ``tokenizer_dir`` is the folder the model was loaded from: its tokenizer files are
    copied so that the checkpoint is a complete Hugging Face folder. ``lora`` (the run's
    LoRAConfig): write the adapter alone, as a PEFT folder naming ``tokenizer_dir`` (the
    base) as its base model.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from agentrl.model.checkpoint import save_state_dict
    from agentrl.parallel.groups import broadcast_object, get_rank

    final = step_dir(run_dir, state.step)
    is_main = get_rank() == 0
    tmp = None
    if is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{state.step}-", dir=final.parent))
    tmp = Path(broadcast_object(str(tmp) if tmp else None))
    try:
        weights = _weights_to_save(model, lora)  # on rank 0's CPU, one at a time
        dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)},
                 checkpoint_id=tmp / OPTIMIZER_DIR)
        if not is_main:
            return final
        if lora is not None:
            from agentrl.model.peft_format import save_adapter

            save_adapter(tmp, weights, lora, Path(tokenizer_dir or ""))
        else:
            save_state_dict(model.config, weights, tmp, "float32")
        del weights
        copy_tokenizer_files(tokenizer_dir, tmp)
        capture_rng(state)
        (tmp / STATE_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(state)))
        torch.save({"scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "torch_rng": torch.get_rng_state()}, tmp / TRAINER_FILE)
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _weights_to_save(model: torch.nn.Module, lora: Any) -> dict[str, torch.Tensor]:
    """The full fp32 state dict (rank 0), or with LoRA the adapter tensors alone
    (collective either way)."""
    from agentrl.parallel.fsdp import full_state_dict, iter_full_parameters

    if lora is None:
        return full_state_dict(model)
    from agentrl.model.lora import is_adapter

    return {name: tensor.to("cpu") for name, tensor in
            iter_full_parameters(model, torch.float32, select=is_adapter)}


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
    for child in path.rglob("*"):
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
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> TrainerState:
    """Restore optimizer, scheduler and every RNG from a checkpoint; return its counters
    (collective: call on every rank).

    The weights are loaded separately (``agentrl.parallel.fsdp.load_sharded`` reads the
    checkpoint folder), so this never holds two copies of the model. Rank 0 reads the
    counters and the scheduler and broadcasts them; each rank reads its optimizer shards.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from agentrl.parallel.groups import broadcast_object, get_rank

    path = Path(path)
    if get_rank() == 0 and not (path / STATE_FILE).exists():
        raise ValueError(
            f"{path} is not a complete agentrl checkpoint (no {STATE_FILE}); pass a "
            f"RUN_DIR/{CHECKPOINT_DIR}/step_N folder"
        )
    blob = None
    if get_rank() == 0:
        blob = {"state": (path / STATE_FILE).read_bytes(),
                **torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=True)}
    blob = broadcast_object(blob)
    template = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(template, checkpoint_id=path / OPTIMIZER_DIR)
    set_optimizer_state_dict(model, optimizer, template["optimizer"])
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["torch_rng"])
    state = msgspec.json.decode(blob["state"], type=TrainerState)
    restore_rng(state)
    return state

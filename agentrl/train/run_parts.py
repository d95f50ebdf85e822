"""The pieces :func:`agentrl.train.run.build_run` assembles: the model folders and their
weights, the sharded policy, the attention backend, memory settings, seeds, and the run's
config and rollout-transcript files."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from agentrl.config import Config
from agentrl.memory.plan import resolve_activation_checkpointing
from agentrl.model.compile import compile_model
from agentrl.parallel import groups
from agentrl.parallel.fsdp import load_sharded
from agentrl.train.checkpoint import latest_checkpoint


def training_gpus_here(group: dist.ProcessGroup | None) -> int:
    """Training ranks on this machine (torchrun's LOCAL_WORLD_SIZE): the GPUs colocated
    replicas share and separate ones come after."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", groups.get_world_size(group)))


def model_folders(config: Config, run_dir: Path, resume: bool
                  ) -> tuple[Path, Path, Path | None, dict[str, torch.Tensor]]:
    """Rank 0: (initial model folder, folder to load, checkpoint or None, its weights)."""
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ValueError(f"--resume: {run_dir} holds no complete checkpoint; drop --resume "
                         "to start a new run there")
    run_dir.mkdir(parents=True, exist_ok=True)
    initial_dir = resolve_model_dir(config, run_dir)
    if config.model.lora is not None:  # the frozen base, and the adapter to train
        from agentrl.train.lora import adapter_state

        adapters = adapter_state(config.model.lora, initial_dir, checkpoint, config.train.seed)
        return initial_dir, initial_dir, checkpoint, read_model_state(initial_dir) | adapters
    model_dir = Path(checkpoint or initial_dir)
    return initial_dir, model_dir, checkpoint, read_model_state(model_dir)


def load_policy(config: Config, model_dir: Path, state: dict[str, torch.Tensor],
                compute: torch.dtype, attention: str, device: torch.device) -> Any:
    """The policy, sharded over all ranks: fp32 master weights, or with ``[model.lora]``
    the frozen base in the compute dtype plus fp32 adapters (collective)."""
    lora = config.model.lora
    if lora is None:
        return load_sharded(model_dir, state, torch.float32, compute, attention, device)
    from agentrl.model.lora import add_adapters

    return load_sharded(model_dir, state, compute, compute, attention, device,
                        prepare=lambda model: add_adapters(model, lora))


def read_model_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """The checked weights of a Hugging Face folder, in fp32, on this CPU."""
    from agentrl.model import read_args
    from agentrl.model.checkpoint import read_checkpoint_state

    state = read_checkpoint_state(model_dir, read_args(model_dir))
    return {k: v.float() for k, v in state.items()}


def announce_attention(choice: str, dtype: torch.dtype, device: torch.device,
                       is_main: bool) -> str:
    """The attention backend to build the model with; rank 0 says once which and why."""
    from agentrl.model.attention import choose_backend

    backend, why = choose_backend(choice, dtype, device)
    if is_main:
        print(f"attention: {why}", flush=True)
    return backend


def configure_memory(config: Config, model: Any, reference: Any, device: torch.device) -> None:
    """Activation checkpointing (train.activation_checkpointing; "auto": on a GPU), the
    log-prob chunk of the training forward, a deterministic attention backward
    (train.deterministic) and torch.compile (model.compile), for the policy and the
    reference model."""
    checkpointing = resolve_activation_checkpointing(config.train.activation_checkpointing,
                                                     on_gpu=device.type == "cuda")
    for m in (model, reference):
        if m is not None:
            m.configure_memory(checkpointing, config.train.logprob_chunk_tokens)
            m.deterministic_attention = config.train.deterministic
            compile_model(m, config.model.compile)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (a resume then restores the saved states over these)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_model_dir(config: Config, run_dir: Path) -> Path:
    """The model folder: ``model.path`` (see ``preflight_facts.locate_model_dir``), or a
    tiny built-in checkpoint built once into ``RUN_DIR/base_model``."""
    if config.model.path:
        from agentrl.train.preflight_facts import locate_model_dir

        return locate_model_dir(config.model.path)
    from agentrl.model import build_tiny_checkpoint

    tiny = run_dir / "base_model"
    if not (tiny / "config.json").exists():
        build_tiny_checkpoint(tiny, seed=config.train.seed)
    return tiny


def build_rollout_log(config: Config, run_dir: Path, tokenizer: Any,
                      resume_step: int | None) -> Any:
    """The writer of sampled rollout transcripts (``RUN_DIR/rollouts/``)."""
    from agentrl.transcripts.store import RolloutSampleWriter

    log = config.log
    return RolloutSampleWriter(run_dir, tokenizer, log.rollouts_every,
                               log.rollouts_random_per_env, config.train.seed, resume_step)


def write_run_config(config: Config, run_dir: Path) -> None:
    """Keep the resolved config next to the metrics (what exactly ran)."""
    (run_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))

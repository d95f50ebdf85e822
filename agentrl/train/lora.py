"""A LoRA run's weights: the frozen base from the model folder, the adapter from the
checkpoint (or fresh), and the checks that the two belong together.

The base is always read from the initial model folder (``model.path`` or the tiny
built-in one) and stored in the compute dtype; a checkpoint holds only the adapter, in
PEFT's format (``agentrl.model.peft_format``). A resume refuses a checkpoint whose
adapter has another rank, alpha or target modules than the config.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config.train_settings import LoRAConfig
from agentrl.model.args import read_args
from agentrl.model.lora import adapter_shapes, initial_adapter_state
from agentrl.model.peft_format import read_adapter, read_adapter_config


def adapter_state(lora: LoRAConfig, base_dir: Path, checkpoint: Path | None,
                  seed: int) -> dict[str, torch.Tensor]:
    """The adapter a run starts from: the checkpoint's (checked against ``lora`` and the
    base's shapes), or fresh ones (B = 0: exactly the base model) seeded by ``seed``."""
    args = read_args(base_dir)
    if checkpoint is None:
        return initial_adapter_state(args, lora, seed)
    check_same_adapter(lora, checkpoint)
    state = read_adapter(checkpoint)
    expected = adapter_shapes(args, lora)
    wrong = sorted(k for k in expected.keys() | state.keys()
                   if expected.get(k) != (tuple(state[k].shape) if k in state else None))
    if wrong:
        raise ValueError(f"{checkpoint}: the adapter does not fit the base model in "
                         f"{base_dir} (tensors {wrong[:3]}); resume with the base it was "
                         "trained on")
    return {k: v.float() for k, v in state.items()}


def check_same_adapter(lora: LoRAConfig, checkpoint: Path) -> None:
    """ValueError unless the checkpoint's adapter has the config's rank, alpha and targets."""
    saved, _ = read_adapter_config(checkpoint)
    for field in ("rank", "alpha", "target_modules"):
        if getattr(saved, field) != getattr(lora, field):
            raise ValueError(f"{checkpoint}: its adapter has {field} = {getattr(saved, field)!r} "
                             f"but model.lora.{field} = {getattr(lora, field)!r}; resume with "
                             "the settings it was trained with")

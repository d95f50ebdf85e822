"""Adapters on disk in PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

What ``peft.PeftModel.from_pretrained(hf_base_model, folder)`` loads: the tensor keys are
our parameter names behind PEFT's ``base_model.model.`` prefix (the adapter's own name,
"default", is never stored), and the config is a LoRA config of the same rank, alpha,
dropout and target modules. Nothing of the base model is written: the folder names it in
``base_model_name_or_path``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agentrl.config.train_settings import LoRAConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a PEFT adapter (rather than a full model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def peft_config(lora: LoRAConfig, base_model: str | Path) -> dict[str, object]:
    """The ``adapter_config.json`` dict of a LoRA adapter for ``base_model``: a local
    folder is recorded as its absolute path, so ``AutoPeftModelForCausalLM`` finds the
    base from any working folder (a relative one resolves only where training ran); any
    other name (a hub id) as given."""
    local = Path(base_model)
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(local.resolve() if local.is_dir() else base_model),
        "revision": None,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": lora.target_modules, "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
        "use_rslora": False, "use_dora": False, "layers_to_transform": None,
        "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
    }


def save_adapter(path: str | Path, adapters: dict[str, torch.Tensor], lora: LoRAConfig,
                 base_model: str | Path) -> Path:
    """Write ``adapters`` (our names, e.g. ``model.layers.0.mlp.up_proj.lora_A.weight``)
    as a PEFT adapter folder; returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / ADAPTER_CONFIG).write_text(json.dumps(peft_config(lora, base_model), indent=2))
    tensors = {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in adapters.items()}
    save_file(tensors, path / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    return path


def read_adapter_config(path: str | Path) -> tuple[LoRAConfig, str]:
    """(the LoRA settings, base_model_name_or_path) of an adapter folder; ValueError when
    it is not a plain LoRA adapter agentrl can run (DoRA, rsLoRA, per-module ranks)."""
    file = Path(path) / ADAPTER_CONFIG
    if not file.is_file():
        raise ValueError(f"{path} has no {ADAPTER_CONFIG}; point at a LoRA checkpoint folder")
    raw = json.loads(file.read_text())
    unsupported = [key for key in ("use_dora", "use_rslora", "rank_pattern", "alpha_pattern",
                                   "modules_to_save", "layers_to_transform") if raw.get(key)]
    if raw.get("peft_type") != "LORA" or unsupported or raw.get("bias", "none") != "none":
        raise ValueError(f"{file}: a {raw.get('peft_type')} adapter with {unsupported or 'a bias'}"
                         "; agentrl runs plain LoRA adapters (one rank and alpha, no bias)")
    targets = raw["target_modules"]
    lora = LoRAConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]),
                      dropout=float(raw.get("lora_dropout") or 0.0),
                      target_modules=targets if isinstance(targets, str) else list(targets))
    return lora, str(raw.get("base_model_name_or_path") or "")


def read_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a PEFT folder under our parameter names."""
    file = Path(path) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise ValueError(f"{path} has no {ADAPTER_WEIGHTS}; it is not a complete adapter")
    state = load_file(file)
    foreign = [k for k in state if not k.startswith(PEFT_PREFIX)]
    if foreign:
        raise ValueError(f"{file}: keys {foreign[:3]} lack PEFT's {PEFT_PREFIX!r} prefix")
    return {k.removeprefix(PEFT_PREFIX): v for k, v in state.items()}

"""What fits a given GPU: the known models under a config's settings, the largest LoRA
rank, and whether LoRA would make a full fine-tuning config fit (``agentrl plan
--gpu-memory`` prints them under the plan)."""

from __future__ import annotations

import msgspec

from agentrl.config import Config, LoRAConfig
from agentrl.memory.plan import GIB, MemoryPlan, plan_memory
from agentrl.model.args import ModelArgs
from agentrl.model.shapes import KNOWN_SHAPES

LORA_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
"""Ranks tried for the largest that fits (powers of two, vLLM's supported ones among them)."""


def with_lora(config: Config, lora: LoRAConfig | None) -> Config:
    """``config`` with ``[model.lora]`` set to ``lora`` (None: full fine-tuning)."""
    return msgspec.structs.replace(
        config, model=msgspec.structs.replace(config.model, lora=lora))


def known_models(config: Config, gpu_gib: float, num_ranks: int) -> list[tuple[str, MemoryPlan]]:
    """The plan of each known model shape (``agentrl.model.shapes``) under ``config``."""
    return [(name, plan_memory(config, args, gpu_gib, num_ranks))
            for name, args in KNOWN_SHAPES.items()]


def largest_lora_rank(config: Config, args: ModelArgs, gpu_gib: float, num_ranks: int) -> int:
    """The largest rank of :data:`LORA_RANKS` whose plan fits (0: none does)."""
    assert config.model.lora is not None
    best = 0
    for rank in LORA_RANKS:
        lora = msgspec.structs.replace(config.model.lora, rank=rank)
        if plan_memory(with_lora(config, lora), args, gpu_gib, num_ranks).fits:
            best = rank
    return best


def describe_fit(config: Config, args: ModelArgs, gpu_gib: float, num_ranks: int) -> str:
    """Lines under the plan: the known models with these settings, the largest LoRA rank
    (LoRA configs), or the plan with LoRA at rank 16 (full fine-tuning configs)."""
    lines = [f"known models with these settings on {gpu_gib:g} GiB × {num_ranks} rank(s):"]
    for name, plan in known_models(config, gpu_gib, num_ranks):
        verdict = "fits" if plan.fits else "does not fit"
        lines.append(f"  {name:<14} {plan.total_bytes / GIB:7.2f} GiB  {verdict}")
    if config.model.lora is not None:
        rank = largest_lora_rank(config, args, gpu_gib, num_ranks)
        lines.append(f"LoRA: the largest rank of {LORA_RANKS[0]}..{LORA_RANKS[-1]} that fits: "
                     f"{rank or 'none'}")
    else:
        lora = plan_memory(with_lora(config, LoRAConfig()), args, gpu_gib, num_ranks)
        verdict = "fits" if lora.fits else "does not fit"
        lines.append(f"with [model.lora] (rank 16, every projection): "
                     f"{lora.total_bytes / GIB:.2f} GiB, {verdict}")
    return "\n".join(lines)

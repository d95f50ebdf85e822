"""The optimizer and lr scheduler of a run: AdamW over the trainable parameters, and
:func:`agentrl.config.schedule.lr_factor` applied once per optimizer update."""

from __future__ import annotations

import torch

from agentrl.config import OptimConfig
from agentrl.config.schedule import lr_factor


def build_optimizer(model: torch.nn.Module, optim: OptimConfig,
                    lr: float | None = None) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters with the peak lr: ``lr`` when given
    (``effective_lr``), else ``optim.lr``. Fused (one pass over each parameter's state
    instead of one kernel per operation) where every parameter is a float on a CPU or a
    GPU: on 2 CPU cores an 8-layer, 512-hidden model's step takes 0.018 s fused against
    0.062 s (``python -m bench.optimizer_step``), the same update to float rounding."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=optim.lr if lr is None else lr, betas=tuple(optim.betas),
        weight_decay=optim.weight_decay, fused=fusable(params) or None,
    )


def fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes ``params``: floating point, on a CPU or CUDA."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                for p in params)


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying :func:`lr_factor`; call ``.step()`` after every optimizer update."""
    warmup = optim.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: lr_factor(update, warmup))

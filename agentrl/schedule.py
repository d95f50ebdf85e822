"""Learning-rate schedule: linear warm-up over optimizer updates, then constant.

Counted in optimizer *updates* (not steps): a step with ``num_steps_per_rollout`` updates
advances the schedule that many times, so the warm-up length does not depend on how a
collection is split into updates.
"""

from __future__ import annotations

import torch

from agentrl.config import OptimConfig


def lr_factor(update: int, warmup_steps: int) -> float:
    """Multiplier of the peak lr for the ``update``-th optimizer update (0-based).

    The first update already gets a non-zero lr (1 / warmup_steps of the peak), so no
    update is wasted at lr 0.
    """
    if warmup_steps <= 0 or update >= warmup_steps:
        return 1.0
    return (update + 1) / warmup_steps


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters with the configured peak lr."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying :func:`lr_factor`; call ``.step()`` after every optimizer update."""
    warmup = optim.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: lr_factor(update, warmup))

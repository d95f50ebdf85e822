"""Learning-rate schedule: linear warm-up over optimizer updates, then constant.

The arithmetic and its load-time check; ``agentrl.train.optimizer`` builds the torch
optimizer and scheduler from it.

Counted in optimizer *updates* (not steps): a step with ``num_steps_per_rollout`` updates
advances the schedule that many times, so the warm-up length does not depend on how a
collection is split into updates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from agentrl.config.ranges import ConfigError

if TYPE_CHECKING:
    from agentrl.config.settings import Config

MAX_LR_SCALING_RATIO = 16.0
"""lr_scaling = "sqrt" is refused when global_batch_size and lr_reference_batch differ by
more than this factor (either way): see :func:`effective_lr`."""


def lr_factor(update: int, warmup_steps: int) -> float:
    """Multiplier of the peak lr for the ``update``-th optimizer update (0-based).

    The first update already gets a non-zero lr (1 / warmup_steps of the peak), so no
    update is wasted at lr 0.
    """
    if warmup_steps <= 0 or update >= warmup_steps:
        return 1.0
    return (update + 1) / warmup_steps


def effective_lr(config: Config) -> float:
    """The peak lr the optimizer uses: ``optim.lr``, or with ``lr_scaling = "sqrt"``
    lr × sqrt(global_batch_size / lr_reference_batch).

    The square-root rule keeps Adam's update noise constant when the batch changes
    (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms"), and GRPO learning curves stay approximately batch-size invariant under
    it, counting the batch in rollouts, within a bounded range. It holds while the batch
    stays below the critical batch size, where gradient noise dominates; past it the
    optimal Adam lr stops rising and eventually falls (Li et al. 2024, "Surge Phenomenon
    in Optimal Learning Rate and Batch Size Scaling"), so scaled lrs overshoot. We allow
    ratios within a factor of ``MAX_LR_SCALING_RATIO`` either way; that bound is ours
    (a range the cited studies cover, not a measured edge): re-tune lr past it.
    """
    optim = config.optim
    if optim.lr_scaling == "none":
        return optim.lr
    assert optim.lr_reference_batch is not None  # check_lr_scaling refuses otherwise
    return optim.lr * math.sqrt(config.batch.global_batch_size / optim.lr_reference_batch)


def check_lr_scaling(config: Config) -> None:
    """Refuse a scaling without its reference, a reference without scaling, and ratios
    outside the range where the square-root rule is known to hold."""
    optim, batch = config.optim, config.batch.global_batch_size
    if optim.lr_scaling == "none":
        if optim.lr_reference_batch is not None:
            raise ConfigError('optim.lr_reference_batch is set but optim.lr_scaling = "none"; '
                              'set lr_scaling = "sqrt" to use it, or drop it')
        return
    reference = optim.lr_reference_batch
    if reference is None or reference < 1:
        raise ConfigError('optim.lr_scaling = "sqrt" needs optim.lr_reference_batch >= 1: '
                          "the global_batch_size (rollouts) at which optim.lr was tuned")
    ratio = batch / reference
    if not 1 / MAX_LR_SCALING_RATIO <= ratio <= MAX_LR_SCALING_RATIO:
        raise ConfigError(
            f"global_batch_size {batch} is {ratio:g}× optim.lr_reference_batch {reference}; "
            f"the square-root lr rule is only trusted within {MAX_LR_SCALING_RATIO:g}× either "
            "way (past the critical batch size it overshoots): re-tune optim.lr at a nearer "
            "reference batch")


def describe_lr(config: Config) -> str:
    """One line for ``agentrl plan``: the peak lr the optimizer will use, and why."""
    lr = effective_lr(config)
    if config.optim.lr_scaling == "none":
        return f"learning rate: {lr:g} (peak)"
    return (f"learning rate: {lr:.4g} (peak) = {config.optim.lr:g} × sqrt("
            f"{config.batch.global_batch_size} / {config.optim.lr_reference_batch}) "
            "rollouts per update (square-root scaling)")

"""One optimizer update's forward/backward over packed micro-batches, on one or many ranks.

Order matters: the update's token count N is summed over micro-batches AND ranks before
the first backward, because every token's loss is divided by N. Each ``.backward()`` then
adds its micro-batch's already-normalized gradient; with several ranks the model is
FSDP2-sharded (``agentrl.parallel.fsdp``), which reduce-scatters and SUMS the ranks'
gradients in fp32. The result equals one backward over all rows at once (invariant 4).
Gradient clipping and the optimizer step belong to the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec
import torch
from torch import Tensor, nn

from agentrl.config import LossConfig
from agentrl.loss import LossParts, policy_loss
from agentrl.model.logprobs import TokenScores
from agentrl.observe.profile import section
from agentrl.packing import MicroBatch
from agentrl.parallel import groups
from agentrl.parallel.fsdp import is_sharded, set_gradient_sync


class CausalLM(Protocol):
    """Any module with the model's training forward: ids [B, T] and targets [B, T] →
    TokenScores (log_softmax(logits / temperature)[target] [B, T] and the entropy)."""

    def __call__(
        self, input_ids: Tensor, position_ids: Tensor | None, cu_seqlens: Tensor | None, *,
        targets: Tensor, temperature: float, with_entropy: bool, positions: Tensor | None,
    ) -> TokenScores: ...


class UpdateStats(msgspec.Struct):
    """Figures of one update, over all its micro-batches and ranks (token-weighted)."""

    loss: float
    """policy_loss + kl_loss: the value whose gradient was accumulated."""
    policy_loss: float
    kl_loss: float
    clip_frac_low: float
    clip_frac_high: float
    approx_kl: float
    entropy: float
    """Mean entropy of the policy over the update's generated tokens."""
    mismatch: float
    tis_weight: float
    num_tokens: int
    """Generated valid tokens of the update, all ranks: the loss's denominator."""
    num_micro_batches: int
    """Micro-batches on this rank."""
    veto_frac: float = 0.0
    """Share of the update's tokens the negative-advantage veto took out of the gradient."""


_FIGURES = (
    "policy_loss", "kl_loss", "clip_frac_low", "clip_frac_high", "approx_kl", "mismatch",
    "tis_weight", "veto_frac",
)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def head_positions(mb: MicroBatch) -> Tensor:
    """Flat indices of the micro-batch's generated tokens (its loss mask): ``collate``
    found them on the host (on a GPU a ``nonzero`` would wait for the queued work at
    every micro-batch); found here for a micro-batch built otherwise."""
    if mb.head_positions is not None:
        return mb.head_positions
    return mb.loss_mask.reshape(-1).nonzero().squeeze(-1)


def target_scores(model: nn.Module, mb: MicroBatch, temperature: float = 1.0,
                  with_entropy: bool = True) -> TokenScores:
    """Log-probs and entropy of the micro-batch's targets under the distribution the
    engine sampled from: logits divided by the rollout temperature, as the engines do
    before reporting log-probs (a temperature of 0, greedy, reports log-probs at
    temperature 1). Without this, ratios are off whenever T != 1. The model computes them
    from its hidden states in chunks (no [T, V] logits), only at the generated tokens
    (:func:`head_positions`, with the micro-batch's shape padding): every other position
    reads 0, which nothing downstream reads."""
    padding = mb.head_padding if mb.head_positions is not None else 0
    return model(mb.input_ids, mb.position_ids, mb.cu_seqlens, targets=mb.target_ids,
                 temperature=temperature, with_entropy=with_entropy,
                 positions=head_positions(mb), bounds=mb.bounds or None,
                 prefix_of=mb.prefix_of or None, head_padding=padding)


def forward_backward(
    model: nn.Module,
    micro_batches: Sequence[MicroBatch],
    cfg: LossConfig,
    process_group: torch.distributed.ProcessGroup | None = None,
    temperature: float = 1.0,
    old_is_current: bool = False,
    gradient_sync: str = "update",
) -> UpdateStats:
    """Accumulate one update's gradient over this rank's micro-batches (and sum over ranks).

    Every rank must pass the same number of micro-batches (``plan_micro_batches`` pads
    with empty ones). Gradients are added to whatever ``.grad`` holds: zero them first.
    ``temperature``: the rollout temperature (see ``target_scores``). ``old_is_current``:
    the old (proximal) policy is the model as it is now (a collection's first update), so
    the forward's own log-probs, detached, are the ratio's denominator: the same values a
    scoring pass would give, without its forward. ``gradient_sync`` (train.gradient_sync):
    "update" reduce-scatters the gradients over the ranks once, in the last micro-batch's
    backward; "micro_batch" in every one.
    """
    if groups.is_distributed(process_group) and not is_sharded(model):
        raise ValueError("forward_backward on several ranks needs an FSDP2-sharded model "
                         "(agentrl.parallel.fsdp.shard_model), which sums the gradients")
    device = _device_of(model)
    local_tokens = sum(mb.num_tokens for mb in micro_batches)
    num_tokens = groups.all_reduce_scalar(local_tokens, process_group, device)
    # no generated token anywhere: run the same calls (collectives stay matched) with a
    # harmless denominator; every mask is 0 so the gradient is 0
    denominator = max(num_tokens, 1.0)
    sums = torch.zeros(len(_FIGURES) + 1, dtype=torch.float64, device=device)
    last = len(micro_batches) - 1
    # one rank too: FSDP2's post-backward reduce copies, scales and re-chunks every
    # gradient even with nobody to send it to (13% of an 8-layer CPU step, each micro-batch)
    every = gradient_sync == "micro_batch"
    for index, mb in enumerate(micro_batches):
        set_gradient_sync(model, every or index == last)
        mb = mb.to(device)  # one copy, the head's positions with it; no sync below
        with groups.one_communicator_at_a_time():  # a weight sync thread waits meanwhile
            logprobs, token_entropy = target_scores(model, mb, temperature)
            old = logprobs.detach() if old_is_current else mb.old_logprobs
            loss, parts = policy_loss(
                logprobs, old, mb.advantages, mb.loss_mask, denominator, cfg,
                engine_logprobs=mb.engine_logprobs, ref_logprobs=mb.ref_logprobs,
                ages=mb.ages, cu_seqlens=mb.cu_seqlens,
            )
            with section("train/backward"):
                loss.backward()
        sums += _figures(parts, token_entropy, mb.loss_mask, denominator)
        del logprobs, loss  # free this micro-batch's activations before the next
    groups.all_reduce_sum(sums, process_group)
    return _stats(sums.tolist(), int(num_tokens), len(micro_batches))


def _figures(parts: LossParts, token_entropy: Tensor, mask: Tensor, num_tokens: float) -> Tensor:
    values = [getattr(parts, name) for name in _FIGURES]
    values.append((token_entropy * mask).sum() / num_tokens)
    return torch.stack([v.double() for v in values])


def _stats(sums: list[float], num_tokens: int, num_micro_batches: int) -> UpdateStats:
    named = dict(zip(_FIGURES, sums[:-1], strict=True))
    return UpdateStats(
        loss=named["policy_loss"] + named["kl_loss"],
        entropy=sums[-1],
        num_tokens=num_tokens,
        num_micro_batches=num_micro_batches,
        **named,
    )


@torch.no_grad()
def score(
    model: nn.Module, micro_batches: Sequence[MicroBatch], temperature: float = 1.0
) -> list[Tensor]:
    """Per-token log-probs [1, T] of each micro-batch's targets under ``model`` (no grad).

    Used for the old-policy pass before a collection's first update (set them as the
    later updates' ``old_logprobs``), for reference-model log-probs, and for the trainer
    side of the engine-vs-trainer log-prob check. Positions with loss mask 0 are set to 0.
    """
    device = _device_of(model)
    out = []
    for mb in micro_batches:
        mb = mb.to(device)
        with groups.one_communicator_at_a_time():
            scores = target_scores(model, mb, temperature, with_entropy=False)
        out.append(scores.logprobs * mb.loss_mask)
    return out


def with_logprobs(
    micro_batches: Sequence[MicroBatch], logprobs: Sequence[Tensor],
    field: Literal["old_logprobs", "ref_logprobs"] = "old_logprobs",
) -> list[MicroBatch]:
    """The micro-batches with a scoring pass's output as their old-policy log-probs (the
    ratio's denominator) or as the reference model's (the KL term). The log-probs stay
    where the scoring pass left them (the model's device): reading them back to the host
    would wait for the GPU at every micro-batch."""
    return [
        msgspec.structs.replace(mb, **{field: lp})
        for mb, lp in zip(micro_batches, logprobs, strict=True)
    ]


def step_if_finite(optimizer: torch.optim.Optimizer, stats: UpdateStats,
                   grad_norm: float) -> str | None:
    """Take the optimizer step unless the update's loss or gradient norm is not finite;
    returns why it was skipped (None when the step was taken).

    Call after ``forward_backward`` and ``clip_grad_norm``. Both figures are already
    summed over ranks (the loss by ``forward_backward``, the norm over all shards), so
    every rank takes the same decision and the weights stay identical across ranks; a
    skipped update leaves the weights and the optimizer's moments untouched (its NaN
    gradients are zeroed by the next update).
    """
    if math.isfinite(stats.loss) and math.isfinite(grad_norm):
        optimizer.step()
        return None
    return f"non-finite update (loss {stats.loss}, gradient norm {grad_norm})"

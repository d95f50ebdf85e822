"""The training loop, in the order it runs.

One *step* = one collection and its ``num_steps_per_rollout`` optimizer updates::

    collect (runner: sampler → rollouts, dynamic sampling; rank 0, broadcast to all ranks;
             with rollout.max_staleness = k >= 1 the asynchronous collector generated it
             ahead, by weights at most k versions old)
      → reassemble (rollouts → rows)  → advantages (one per rollout, broadcast to rows)
      → split into updates by rollout → pack into micro-batches (this rank's share)
      → old-policy scoring pass of the 2nd.. updates' rows (several updates per
        collection, or loss.objective = "decoupled"; the first update's forward is its own)
      → for each update: forward/backward (FSDP2: tokens counted and gradients summed
        over ranks), clip, AdamW step on the fp32 shards, lr schedule
      → weight sync to the engine (version = steps trained) → metrics (with staleness),
        validation (rank 0), checkpoint

Setup lives in :mod:`agentrl.train.run` (``build_run``); this module only runs.
"""

from __future__ import annotations

import gc
import math
import re
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from agentrl.advantage import compute_advantages
from agentrl.collate_speed import copy_to_device
from agentrl.engines.router import EngineRouter
from agentrl.loss import scores_proximal_policy
from agentrl.observe.compaction import run_declines
from agentrl.observe.costs import cost_figures, length_figures
from agentrl.observe.metrics import (
    collection_figures,
    loss_figures,
    rollout_figures,
    step_stats,
)
from agentrl.observe.profile import (
    PROFILER,
    format_table,
    section,
    step_profile,
    timed,
    traced,
)
from agentrl.observe.writers import read_metrics
from agentrl.packing import MicroBatch, collate, plan_micro_batches
from agentrl.parallel import groups
from agentrl.parallel.caches import return_freed_heap
from agentrl.parallel.fsdp import clip_grad_norm
from agentrl.reassembler import to_rows
from agentrl.rollout.health import InvalidRateMonitor, invalid_figures
from agentrl.shared_prefix import packing_units
from agentrl.staleness import asynchronous_figures, staleness_figures
from agentrl.train.checkpoint import TrainerState, save_checkpoint
from agentrl.train.run import Run
from agentrl.train.update import (
    UpdateStats,
    forward_backward,
    score,
    step_if_finite,
    with_logprobs,
)
from agentrl.types import Rollout, Row

PHASES = ("generate", "train", "sync", "other")


class PhaseTimer:
    """Wall-clock seconds per phase of one step."""

    def __init__(self) -> None:
        """Start every phase at zero."""
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def __call__(self, phase: str) -> AbstractContextManager[None]:
        """Add the time spent inside the ``with`` block to ``phase``."""
        return timed(lambda seconds: self._add(phase, seconds))

    def _add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


def train(run: Run) -> TrainerState:
    """Run steps until ``train.num_steps``, validating, logging and checkpointing."""
    cfg = run.config.train
    health = InvalidRateMonitor(cfg.max_invalid_fraction)
    # warns once per environment whose compaction dies (a resumed run: the steps so far)
    compaction = run_declines(read_metrics(run.run_dir), run.state.step)[0]
    profiled: list[dict[str, float]] = []
    # what setup built (modules, model, engine, tokenizer: millions of objects) lives for
    # the whole run; frozen, the collector's full passes skip it (walking it cost ~35 ms
    # per step of the CPU peer bench)
    gc.freeze()
    try:
        if cfg.eval_every and run.state.step == 0:
            run.writers.write({"step": 0, **cumulative(run.state), **run.validate(0)})
        while run.state.step < cfg.num_steps:
            step = run.state.step + 1
            metrics = profiled_step(run, step, health)
            profiled += [{k: v for k, v in metrics.items() if k.startswith("profile/")}]
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.num_steps):
                metrics.update(run.validate(step))
            if run.is_main:
                compaction.warn(metrics)
            run.writers.write(metrics)
            last = step == cfg.num_steps
            if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                run.state.sampler = run.sampler_state()
                save_checkpoint(run.run_dir, run.state, run.model, run.optimizer,
                                run.scheduler, tokenizer_dir=run.tokenizer_dir,
                                lora=run.config.model.lora)
        run.on_main("finished", lambda: None)  # ranks leave once rank 0 wrote everything
        if PROFILER.enabled and run.is_main:
            print(format_table([p for p in profiled if p]), flush=True)
    finally:
        run.close()
    return run.state


def profiled_step(run: Run, step: int,
                  health: InvalidRateMonitor | None = None) -> dict[str, Any]:
    """:func:`train_step`, with its ``profile/*`` figures when profiling is on (and
    recorded by torch.profiler when it is the ``--profile-trace`` step)."""
    if not PROFILER.enabled:
        return train_step(run, step, health)
    PROFILER.take()  # a validation since the last step is not this step's time
    if PROFILER.trace_step == step and run.is_main:
        with traced(step, run.run_dir):
            metrics = train_step(run, step, health)
    else:
        metrics = train_step(run, step, health)
    phases = {k.removeprefix("time/"): v for k, v in metrics.items() if k.startswith("time/")}
    metrics.update(step_profile(PROFILER.take(), phases))
    return metrics


def train_step(run: Run, step: int,
               health: InvalidRateMonitor | None = None) -> dict[str, Any]:
    """One collection and its updates; returns the step's metrics. ``health`` stops the
    run (RunStopped) before training on a collection whose environment is mostly broken."""
    timer = PhaseTimer()
    if torch.cuda.is_available():  # memory/peak_allocated_gib: this step's own peak
        torch.cuda.reset_peak_memory_stats()
    with timer("generate"):
        collection = run.collect(step)
    if health is not None:
        health.observe(step, collection.num_played, collection.invalid,
                       collection.first_errors)
    with timer("other"):
        rollouts = ordered(collection.rollouts)
        check_collection_size(len(rollouts), run.plan.num_rollouts)
        rows = to_rows(rollouts, run.config.loss.summary_tokens)
        advantages = compute_advantages(
            rows, run.config.advantage.estimator, run.config.advantage.scale_by_std, rollouts
        )
        sample_figures = run.write_rollout_sample(step, rollouts, rows, advantages)
    with timer("train"):
        updates, figures = run_updates(run, rows, advantages,
                                       [r.rollout_id for r in rollouts])
    with timer("sync"):
        run.sync_weights(version=step)
    run.record_trained(step, collection.groups)
    advance_counters(run.state, rollouts, timer)
    metrics: dict[str, Any] = step_stats(step, rollouts,
                                         run.config.loss.summary_tokens).to_flat_dict()
    metrics.update(rollout_figures(rollouts))
    metrics.update(staleness_figures(rollouts, trained_version=step - 1))
    for name in sorted({r.env for r in rollouts}):
        mine = [r for r in rollouts if r.env == name]
        metrics.update(rollout_figures(mine, f"env/{name}/"))
        metrics.update(staleness_figures(mine, step - 1, f"env/{name}/"))
    metrics.update(loss_figures(updates))
    metrics.update(figures)
    metrics.update(collection_figures(collection.dropped, collection.num_rounds,
                                      collection.fallback_groups))
    metrics.update(sample_figures)
    metrics.update(invalid_figures(collection.invalid))
    metrics.update(invalid_figures(collection.retried, "retried"))
    metrics.update(invalid_figures(collection.kept, "kept"))
    if isinstance(run.engine, EngineRouter):  # the collector process keeps its own
        metrics.update(run.engine.replica_figures())
    if run.collector is not None:
        metrics.update(asynchronous_figures(collection.engine_idle_s,
                                            collection.carried_groups))
    metrics.update(length_figures(rollouts, collection.costs))
    costs = cost_figures(collection.costs, run.config.log.costs, run.state.cumulative_cost)
    run.state.cumulative_cost = costs.get("cumulative/cost", run.state.cumulative_cost)
    metrics.update(costs)
    metrics.update(cumulative(run.state))
    metrics.update({f"time/{phase}": s for phase, s in timer.seconds.items()})
    return metrics


def check_collection_size(num_rollouts: int, planned: int) -> None:
    """Refuse to train a collection that is not the batch plan's (invariant 7): the
    updates would silently hold other than ``global_batch_size`` rollouts each. Nothing
    may take rollouts out (staleness never discards: ``agentrl.staleness``)."""
    if num_rollouts != planned:
        raise RuntimeError(
            f"the collection holds {num_rollouts} rollouts but the batch plan has {planned}"
            "; this is a bug in the runner (it must bring exactly the planned groups)")


def ordered(rollouts: list[Rollout]) -> list[Rollout]:
    """Rollouts sorted by id (natural order), so the loss sums in the same order every run.

    Groups finish out of order; float sums do not commute bit for bit, and an exact
    resume needs the same bits.
    """
    return sorted(rollouts, key=lambda r: _natural_key(r.rollout_id))


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def split_by_rollout(rows: list[Row], num_updates: int,
                     rollout_ids: Sequence[str] = ()) -> list[list[int]]:
    """Row indices of each update: rollouts are dealt out whole, in order.

    Counted in rollouts (never rows): each update gets an equal share of the rollouts,
    with all the rows of each of its rollouts. ``rollout_ids``: every rollout of the
    collection in order, so that one without rows (valid or not) still takes its place
    in its update; rollouts only rows name come after them.
    """
    rollout_ids = list(dict.fromkeys([*rollout_ids, *(row.rollout_id for row in rows)]))
    shares = np.array_split(np.arange(len(rollout_ids)), num_updates)
    update_of = {rollout_ids[i]: u for u, share in enumerate(shares) for i in share}
    chunks: list[list[int]] = [[] for _ in range(num_updates)]
    for index, row in enumerate(rows):
        chunks[update_of[row.rollout_id]].append(index)
    return chunks


def micro_batches(run: Run, rows: list[Row], advantages: list[float],
                  rollout_ids: Sequence[str] = ()) -> list[list[MicroBatch]]:
    """Each update's micro-batches on this rank (every rank gets the same count); updates
    are dealt ``rollout_ids`` (see :func:`split_by_rollout`)."""
    num_rollouts = len({*rollout_ids, *(row.rollout_id for row in rows)})
    num_updates = max(1, min(run.plan.num_updates, num_rollouts))
    budget = run.config.batch.max_tokens_per_microbatch
    batches = []
    share = run.share_prefixes
    with section("train/packing"):
        for chunk in split_by_rollout(rows, num_updates, rollout_ids):
            units, lengths = (packing_units(rows, chunk, budget) if share else
                              ([[i] for i in chunk], [len(rows[i].token_ids) for i in chunk]))
            mine = plan_micro_batches(lengths, budget, run.world_size, run.cost)[run.rank]
            batches.append([collate(rows, advantages, [i for j in mb for i in units[j]],
                                    run.state.step, share_prefixes=share,
                                    token_multiple=run.token_multiple) for mb in mine])
    return batches


def run_updates(
    run: Run, rows: list[Row], advantages: list[float], rollout_ids: Sequence[str] = ()
) -> tuple[list[UpdateStats], dict[str, float]]:
    """The collection's optimizer updates, dealt ``rollout_ids`` (the collection's, in
    order: a rollout without rows keeps its place); returns their stats and figures."""
    batches = micro_batches(run, rows, advantages, rollout_ids)
    temperature = run.config.rollout.temperature
    figures: dict[str, float] = {}
    if run.reference is not None:  # kl_coef != 0: the KL term needs π_ref at every token
        batches = [with_logprobs(batch, score(run.reference, batch, temperature),
                                 "ref_logprobs") for batch in batches]
    proximal = scores_proximal_policy(run.config.loss, len(batches))
    scored_sums = None
    if proximal:
        # the old (proximal) policy: the weights before this step's first optimizer
        # update. The first update's forward sees exactly those weights (its own
        # log-probs stand in); the later updates' rows are scored before it changes them
        later = [mb for batch in batches[1:] for mb in batch]
        scored = score(run.model, later, temperature)
        scored_sums = torch.zeros(2, dtype=torch.float64)
        if len(batches) > 1:  # on every rank alike (as many micro-batches per update)
            scored_sums = groups.all_reduce_sum(mismatch_sums(later, scored),
                                                run.process_group)
        it = iter(scored)
        batches = batches[:1] + [with_logprobs(batch, [next(it) for _ in batch])
                                 for batch in batches[1:]]
    stats, norms, lrs, skipped = [], [], [], 0
    for index, batch in enumerate(batches):
        run.optimizer.zero_grad(set_to_none=True)
        with section("train/forward_backward"):
            stats.append(forward_backward(run.model, batch, run.config.loss,
                                          run.process_group, temperature,
                                          old_is_current=proximal and index == 0,
                                          gradient_sync=run.config.train.gradient_sync))
        with section("train/optimizer"):
            norms.append(clip_grad_norm(run.model, run.config.optim.max_grad_norm))
            lrs.append(run.optimizer.param_groups[0]["lr"])
            why = step_if_finite(run.optimizer, stats[-1], norms[-1])
            # freed now, not at the next update: they would sit through the next
            # collection beside the engine's KV cache (one fp32 copy of the model)
            run.optimizer.zero_grad(set_to_none=True)
        if why is not None:
            skipped += 1
            warnings.warn(f"step {run.state.step + 1}, update {index + 1} of {len(batches)}: "
                          f"{why}; skipped, the weights are unchanged", stacklevel=2)
        with warnings.catch_warnings():  # the schedule counts updates, skipped ones too
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            run.scheduler.step()
        run.state.num_updates += 1
    if scored_sums is not None:
        figures["loss/mismatch_scored"] = scored_mismatch(stats[0], scored_sums)
    finite = [n for n in norms if math.isfinite(n)]
    figures["optim/grad_norm"] = float(np.mean(finite)) if finite else float("nan")
    figures["optim/skipped_updates"] = skipped
    figures["optim/lr"] = lrs[-1]
    figures["num_micro_batches"] = sum(len(b) for b in batches)
    figures.update(perf_figures(run, rows))
    return_freed_heap()  # the update's activations, before the next collection
    return stats, figures


def perf_figures(run: Run, rows: list[Row]) -> dict[str, float]:
    """Estimated training FLOPs of the step (all ranks; ``CostModel``: a·L + b·L² per row,
    forward + backward) and, on a GPU, this rank's peak memory since the step began (the
    peak is reset at each step's start), for MFU and memory checks."""
    out = {"perf/train_flops": float(sum(run.cost.cost(len(r.token_ids)) for r in rows))}
    if torch.cuda.is_available():
        out["memory/peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def scored_mismatch(first: UpdateStats, later_sums: torch.Tensor) -> float:
    """Mean |trainer − engine| log-prob over the collection's generated tokens (all ranks)
    under the weights before its first update: the first update's own figure and the
    scoring pass's sums (``mismatch_sums``, summed over ranks) of the later updates."""
    later_total, later_count = later_sums.tolist()
    count = first.num_tokens + later_count
    return (first.mismatch * first.num_tokens + later_total) / count if count else 0.0


def mismatch_sums(micro_batches: list[MicroBatch], scored: list[Any]) -> torch.Tensor:
    """[Σ |trainer − engine| log-prob, Σ tokens] over this rank's generated tokens, on the
    scores' device (the model's; the micro-batches and engine log-probs stay on the CPU)."""
    device = scored[0].device if scored else None
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for mb, lp in zip(micro_batches, scored, strict=True):
        mask, engine = copy_to_device([mb.loss_mask, mb.engine_logprobs], lp.device)
        sums[0] += ((lp - engine).abs() * mask).sum()
        sums[1] += mask.sum()
    return sums


def advance_counters(state: TrainerState, rollouts: list[Rollout], timer: PhaseTimer) -> None:
    """Add the step's rollouts, sampled tokens and active time to the running totals."""
    state.step += 1
    state.cumulative_rollouts += len(rollouts)
    state.cumulative_tokens += sum(r.num_generated_tokens for r in rollouts)
    state.cumulative_active_s += sum(timer.seconds.values())


def cumulative(state: TrainerState) -> dict[str, Any]:
    """The running totals under their metric names (the x-axes of ``agentrl report``)."""
    return {
        "cumulative/rollouts": state.cumulative_rollouts,
        "cumulative/tokens": state.cumulative_tokens,
        "cumulative/updates": state.num_updates,
        "cumulative/active_s": state.cumulative_active_s,
    }

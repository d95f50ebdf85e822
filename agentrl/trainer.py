"""The training loop, in the order it runs.

One *step* = one collection and its ``num_steps_per_rollout`` optimizer updates::

    collect (runner: sampler → rollouts, dynamic sampling)
      → reassemble (rollouts → rows)  → advantages (one per rollout, broadcast to rows)
      → split into updates by rollout → pack into micro-batches
      → old-policy scoring pass (only when a collection has several updates)
      → for each update: forward/backward, clip, AdamW step, lr schedule
      → weight sync to the engine → metrics, validation, checkpoint

Setup lives in the builders at the end (:func:`build_run`); :func:`train` only runs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from agentrl.accounting import BatchPlan, plan_batches
from agentrl.advantage import compute_advantages
from agentrl.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_training_state,
    save_checkpoint,
)
from agentrl.config import Config
from agentrl.metric_writers import build_writers
from agentrl.metrics import step_stats
from agentrl.packing import CostModel, collate, plan_micro_batches
from agentrl.reassembler import to_rows
from agentrl.sampler import EnvironmentSampler
from agentrl.schedule import build_optimizer, build_scheduler
from agentrl.types import Rollout, Row
from agentrl.update import UpdateStats, clip_grad_norm, forward_backward, score, with_old_logprobs

PHASES = ("generate", "train", "sync", "other")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class PhaseTimer:
    """Wall-clock seconds per phase of one step."""

    def __init__(self) -> None:
        """Start every phase at zero."""
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Add the time spent inside the ``with`` block to ``phase``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


def train(run: Run) -> TrainerState:
    """Run steps until ``train.num_steps``, validating, logging and checkpointing."""
    cfg = run.config.train
    try:
        if cfg.eval_every and run.state.step == 0:
            run.writers.write({"step": 0, **cumulative(run.state), **run.validate()})
        while run.state.step < cfg.num_steps:
            step = run.state.step + 1
            metrics = train_step(run, step)
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.num_steps):
                metrics.update(run.validate())
            run.writers.write(metrics)
            last = step == cfg.num_steps
            if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                run.state.sampler = run.sampler.state_dict()
                save_checkpoint(run.run_dir, run.state, run.model, run.optimizer,
                                run.scheduler, tokenizer_dir=run.tokenizer_dir)
    finally:
        run.writers.close()
    return run.state


def train_step(run: Run, step: int) -> dict[str, Any]:
    """One collection and its updates; returns the step's metrics."""
    timer = PhaseTimer()
    with timer("generate"):
        collection = run.collect(step)
    with timer("other"):
        rollouts = ordered(collection.rollouts)
        rows = to_rows(rollouts)
        advantages = compute_advantages(
            rows, run.config.advantage.estimator, run.config.advantage.scale_by_std
        )
    with timer("train"):
        updates, figures = run_updates(run, rollouts, rows, advantages)
    with timer("sync"):
        sync_weights(run)
    advance_counters(run.state, rollouts, timer)
    return step_metrics(run, step, rollouts, collection, updates, figures, timer)


def ordered(rollouts: list[Rollout]) -> list[Rollout]:
    """Rollouts sorted by id (natural order), so the loss sums in the same order every run.

    Groups finish out of order; float sums do not commute bit for bit, and an exact
    resume needs the same bits.
    """
    return sorted(rollouts, key=lambda r: _natural_key(r.rollout_id))


def _natural_key(text: str) -> list[Any]:
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def split_by_rollout(rows: list[Row], num_updates: int) -> list[list[int]]:
    """Row indices of each update: rollouts are dealt out whole, in order.

    Counted in rollouts (never rows): each update gets an equal share of the rollouts,
    with all the rows of each of its rollouts.
    """
    rollout_ids = list(dict.fromkeys(row.rollout_id for row in rows))
    shares = np.array_split(np.arange(len(rollout_ids)), num_updates)
    update_of = {rollout_ids[i]: u for u, share in enumerate(shares) for i in share}
    chunks: list[list[int]] = [[] for _ in range(num_updates)]
    for index, row in enumerate(rows):
        chunks[update_of[row.rollout_id]].append(index)
    return chunks


def run_updates(
    run: Run, rollouts: list[Rollout], rows: list[Row], advantages: list[float]
) -> tuple[list[UpdateStats], dict[str, float]]:
    """The collection's optimizer updates; returns their stats and extra figures."""
    num_updates = max(1, min(run.plan.num_updates, len(rollouts)))
    budget = run.config.batch.max_tokens_per_microbatch
    batches = []
    for chunk in split_by_rollout(rows, num_updates):
        lengths = [len(rows[i].token_ids) for i in chunk]
        plan = plan_micro_batches(lengths, budget, 1, run.cost)[0]
        batches.append([collate(rows, advantages, [chunk[j] for j in mb]) for mb in plan])
    figures: dict[str, float] = {}
    if num_updates > 1:
        # the old policy is the one that generated: score every update's rows before the
        # first optimizer step changes the weights
        flat = [mb for batch in batches for mb in batch]
        scored = score(run.model, flat)
        figures["loss/mismatch_scored"] = _mismatch(flat, scored)
        it = iter(scored)
        batches = [with_old_logprobs(batch, [next(it) for _ in batch]) for batch in batches]
    stats, norms, lrs = [], [], []
    for batch in batches:
        run.optimizer.zero_grad(set_to_none=True)
        stats.append(forward_backward(run.model, batch, run.config.loss))
        norms.append(clip_grad_norm(run.model, run.config.optim.max_grad_norm))
        lrs.append(run.optimizer.param_groups[0]["lr"])
        run.optimizer.step()
        run.scheduler.step()
        run.state.num_updates += 1
    figures["optim/grad_norm"] = float(np.mean(norms))
    figures["optim/lr"] = lrs[-1]
    figures["num_micro_batches"] = sum(len(b) for b in batches)
    return stats, figures


def _mismatch(micro_batches: list[Any], scored: list[Any]) -> float:
    """Mean |trainer − engine| log-prob over generated tokens, before any update."""
    total, count = 0.0, 0.0
    for mb, lp in zip(micro_batches, scored, strict=True):
        total += float(((lp - mb.engine_logprobs).abs() * mb.loss_mask).sum())
        count += float(mb.loss_mask.sum())
    return total / count if count else 0.0


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


def step_metrics(
    run: Run,
    step: int,
    rollouts: list[Rollout],
    collection: Any,
    updates: list[UpdateStats],
    figures: dict[str, float],
    timer: PhaseTimer,
) -> dict[str, Any]:
    """One flat dict: counts (overall and per environment), loss figures, lr, times."""
    metrics: dict[str, Any] = dict(step_stats(step, rollouts).to_flat_dict())
    metrics.update(rollout_figures(rollouts, ""))
    for name in sorted({r.env for r in rollouts}):
        metrics.update(rollout_figures([r for r in rollouts if r.env == name], f"env/{name}/"))
    metrics.update(loss_figures(updates))
    metrics.update(figures)
    metrics.update(collection_figures(collection))
    metrics.update(cumulative(run.state))
    metrics.update({f"time/{phase}": s for phase, s in timer.seconds.items()})
    return metrics


def collection_figures(collection: Any) -> dict[str, float]:
    """Dynamic sampling: rounds run, groups dropped per environment and reason."""
    dropped = getattr(collection, "dropped", {}) or {}
    out: dict[str, float] = {
        "collection/num_rounds": getattr(collection, "num_rounds", 1),
        "collection/fallback_groups": getattr(collection, "fallback_groups", 0),
        "collection/dropped_groups": sum(sum(r.values()) for r in dropped.values()),
    }
    for env, reasons in dropped.items():
        for reason, count in reasons.items():
            out[f"env/{env}/dropped/{reason}"] = count
    return out


def rollout_figures(rollouts: list[Rollout], prefix: str) -> dict[str, float]:
    """Response length, truncation, compaction and turn figures of some rollouts."""
    if not rollouts:
        return {}
    n = len(rollouts)
    return {
        f"{prefix}response_length/mean": sum(r.num_generated_tokens for r in rollouts) / n,
        f"{prefix}truncation_rate": sum(r.stats.truncated for r in rollouts) / n,
        f"{prefix}num_turns/mean": sum(r.stats.num_turns for r in rollouts) / n,
        f"{prefix}num_compactions/mean": sum(r.stats.num_compactions for r in rollouts) / n,
        f"{prefix}invalid_rate": sum(not r.valid for r in rollouts) / n,
        f"{prefix}tool_errors": float(sum(sum(r.stats.tool_errors.values()) for r in rollouts)),
    }


def loss_figures(updates: list[UpdateStats]) -> dict[str, float]:
    """Loss figures averaged over the step's updates, under ``loss/...``."""
    if not updates:
        return {}
    names = ("loss", "policy_loss", "kl_loss", "clip_frac_low", "clip_frac_high",
             "approx_kl", "entropy", "mismatch", "tis_weight")
    out = {f"loss/{name}": float(np.mean([getattr(u, name) for u in updates]))
           for name in names}
    out["loss/clip_frac"] = out["loss/clip_frac_low"] + out["loss/clip_frac_high"]
    out["loss/kl"] = out["loss/approx_kl"]
    out["loss/policy"] = out["loss/policy_loss"]
    return out


# --------------------------------------------------------------------------- setup


@dataclass
class Run:
    """Everything a training run holds, built once by :func:`build_run`."""

    config: Config
    run_dir: Path
    model: Any
    tokenizer: Any
    tokenizer_dir: Path
    """Folder whose tokenizer files every checkpoint copies."""
    engine: Any
    runner: Any
    sampler: EnvironmentSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    writers: Any
    state: TrainerState
    plan: BatchPlan
    cost: CostModel
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def collect(self, step: int) -> Any:
        """One collection of the plan's rollouts (the runner applies dynamic sampling)."""
        return self.loop.run_until_complete(self.runner.collect(step, self.plan.num_rollouts))

    def validate(self) -> dict[str, float]:
        """Accuracy per environment on held-out tasks (``eval/<name>/accuracy``)."""
        from agentrl.evaluation import evaluate

        start = time.perf_counter()
        accuracy = self.loop.run_until_complete(
            evaluate(self.engine, self.tokenizer, self.config,
                     self.config.train.eval_tasks_per_env)
        )
        return {**eval_metrics(accuracy), "time/eval": time.perf_counter() - start}


def eval_metrics(accuracy: dict[str, float]) -> dict[str, float]:
    """``eval/<name>/accuracy`` per environment and their mean as ``eval/accuracy``."""
    out = {f"eval/{name}/accuracy": acc for name, acc in sorted(accuracy.items())}
    if accuracy:
        out["eval/accuracy"] = float(np.mean(list(accuracy.values())))
    return out


def sync_weights(run: Run) -> None:
    """Give the engine the new policy; a torch engine that shares the model needs nothing."""
    if getattr(run.engine, "model", None) is run.model:
        return
    run.engine.update_weights(run.model.state_dict())


def build_run(config: Config, run_dir: str | Path, resume: bool = False) -> Run:
    """Load or build the model, engine, runner, optimizer and writers of a run.

    With ``resume`` the newest checkpoint in ``run_dir`` provides the weights, optimizer,
    scheduler, sampler, RNG states and counters, so the run continues exactly.
    """
    from agentrl.model import load_pretrained, load_tokenizer

    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ValueError(f"--resume: {run_dir} holds no complete checkpoint; drop --resume "
                         "to start a new run there")
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.train.seed)
    model_dir = checkpoint or resolve_model_dir(config, run_dir)
    model = load_pretrained(model_dir, dtype=getattr(torch, config.model.dtype),
                            attention=config.model.attention)
    tokenizer = load_tokenizer(model_dir)
    optimizer = build_optimizer(model, config.optim)
    scheduler = build_scheduler(optimizer, config.optim)
    sampler = EnvironmentSampler(
        {env.display_name(): env.weight for env in config.environments}, config.train.seed
    )
    state = TrainerState()
    if checkpoint is not None:
        state = load_training_state(checkpoint, optimizer, scheduler)
        sampler.load_state_dict(state.sampler)
    engine = build_engine(config, model, tokenizer, model_dir)
    args = model.config
    cost = CostModel.from_model_args(args.hidden_size, args.num_hidden_layers,
                                     args.intermediate_size, args.vocab_size)
    write_run_config(config, run_dir)
    writers = build_writers(run_dir, config.train.num_steps, config.log.live,
                            config.log.tensorboard, resume_step=state.step if resume else None)
    return Run(config=config, run_dir=run_dir, model=model, tokenizer=tokenizer,
               tokenizer_dir=Path(model_dir), engine=engine,
               runner=build_runner(config, engine, tokenizer, sampler), sampler=sampler,
               optimizer=optimizer, scheduler=scheduler, writers=writers, state=state,
               plan=plan_batches(config), cost=cost)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (a resume then restores the saved states over these)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_model_dir(config: Config, run_dir: Path) -> Path:
    """The model folder: ``model.path`` (relative to the working directory or the project),
    or a tiny built-in checkpoint built once into ``RUN_DIR/base_model``."""
    if config.model.path:
        given = Path(config.model.path)
        for candidate in (given, PROJECT_ROOT / given):
            if (candidate / "config.json").exists():
                return candidate
        raise ValueError(f"model.path = {config.model.path!r} has no config.json (looked in "
                         f"{given.resolve()} and {PROJECT_ROOT / given}); give a local Hugging "
                         "Face folder, or leave model.path empty for the tiny built-in model")
    from agentrl.model import build_tiny_checkpoint

    tiny = run_dir / "base_model"
    if not (tiny / "config.json").exists():
        build_tiny_checkpoint(tiny, seed=config.train.seed)
    return tiny


def build_engine(config: Config, model: Any, tokenizer: Any, model_dir: Path) -> Any:
    """The inference engine: the torch engine sharing the trainer's model, or vLLM."""
    rollout = config.rollout
    if rollout.engine == "vllm":
        from agentrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine.from_pretrained(str(model_dir), dtype=config.model.dtype,
                                          seed=config.train.seed)
    from agentrl.rollout.torch_engine import TorchEngine

    if config.compaction.strategy != "none":
        max_len = config.compaction.max_context_tokens + rollout.max_new_tokens + 1
    else:
        max_len = rollout.max_rollout_tokens + 2048  # generated tokens + prompt/observations
    max_len = min(max_len, model.config.max_position_embeddings)
    return TorchEngine(model, tokenizer, max_batch_size=rollout.max_concurrent_rollouts,
                       max_len=max_len, seed=config.train.seed)


def build_runner(config: Config, engine: Any, tokenizer: Any,
                 sampler: EnvironmentSampler) -> Any:
    """The rollout runner over the configured environments."""
    from agentrl.rollout.runner import RolloutRunner

    return RolloutRunner(config, engine, tokenizer, sampler)


def write_run_config(config: Config, run_dir: Path) -> None:
    """Keep the resolved config next to the metrics (what exactly ran)."""
    (run_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))

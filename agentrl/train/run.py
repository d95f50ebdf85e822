"""Setting up a training run: process group, sharded model, engine, runner, optimizer.

:func:`build_run` is the one place a run is assembled; ``agentrl.train.trainer`` only runs it.
Every process is a rank of a process group (a group of one without torchrun). The policy
is sharded with FSDP2 over all ranks: fp32 master weights and AdamW state, compute in
``model.dtype``. Rank 0 alone also holds the inference engine (with its own copy of the
weights in the compute dtype, refreshed after every step), the runner, the writers and
the checkpoint files: it collects each step's rollouts and broadcasts them, every rank
trains on its share of the rows, and FSDP2 sums the gradients over ranks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from agentrl.config import Config
from agentrl.config.accounting import BatchPlan, plan_batches
from agentrl.config.schedule import effective_lr
from agentrl.engines.router import EngineRouter
from agentrl.model.attention import use_deterministic_kernels
from agentrl.model.lora import is_adapter
from agentrl.observe.tracking import tracking_writers
from agentrl.observe.writers import JsonlWriter, MultiWriter, build_writers
from agentrl.packing import CostModel
from agentrl.parallel import groups
from agentrl.parallel.caches import bound_kernel_caches, token_multiple
from agentrl.parallel.fsdp import compute_dtype, iter_full_parameters, load_sharded
from agentrl.parallel.timeouts import Timeouts, timeouts
from agentrl.rollout.build import build_collector, build_engine, build_runner, build_sampler
from agentrl.rollout.carry_over import check_resumable
from agentrl.sampler import EnvironmentSampler
from agentrl.train.checkpoint import TrainerState, load_training_state
from agentrl.train.optimizer import build_optimizer, build_scheduler
from agentrl.train.run_parts import (
    announce_attention,
    build_rollout_log,
    configure_memory,
    load_policy,
    model_folders,
    read_model_state,
    seed_everything,
    training_gpus_here,
    write_run_config,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRAINED_ROLLOUTS_FILE = "trained_rollouts.jsonl"
EVAL_TASKS_FILE = "eval_tasks.jsonl"


@dataclass
class Run:
    """Everything a training run holds, built once by :func:`build_run`."""

    config: Config
    run_dir: Path
    model: Any
    """The policy, FSDP2-sharded over all ranks (fp32 master weights)."""
    tokenizer_dir: Path
    """Folder whose tokenizer files every checkpoint copies."""
    sampler: EnvironmentSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainerState
    plan: BatchPlan
    cost: CostModel
    timeouts: Timeouts
    compute_dtype: torch.dtype
    share_prefixes: bool = False
    """Training packs hold a group's shared prompt once (batch.share_prefixes, with the
    exact per-row attention only)."""
    token_multiple: int = 1
    """Training micro-batches are padded to multiples of this many tokens
    (batch.token_multiple, resolved by ``agentrl.parallel.caches.token_multiple``)."""
    process_group: dist.ProcessGroup | None = None
    reference: Any = None
    """Frozen initial model for the KL term (only when loss.kl_coef != 0), sharded."""
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    # rank 0 only (None on the other ranks):
    tokenizer: Any = None
    engine: Any = None
    """The inference replicas behind a router (None with a collector process: they live
    in it)."""
    runner: Any = None
    collector: Any = None
    """The asynchronous collector (rollout.max_staleness >= 1), else None."""
    writers: Any = field(default_factory=lambda: MultiWriter([]))
    rollout_log: Any = None
    """Writes sampled rollouts as transcripts."""
    trained_log: Any = None
    """``RUN_DIR/trained_rollouts.jsonl``: which rollouts every step trained."""
    eval_log: Any = None
    """``RUN_DIR/eval_tasks.jsonl``: every validation's outcome per held-out task."""

    @property
    def rank(self) -> int:
        """This process's data-parallel rank (0 on one process)."""
        return groups.get_rank(self.process_group)

    @property
    def world_size(self) -> int:
        """Data-parallel ranks (1 on one process)."""
        return groups.get_world_size(self.process_group)

    @property
    def is_main(self) -> bool:
        """Rank 0: generates, writes metrics and checkpoints."""
        return self.rank == 0

    def on_main(self, tag: str, work: Any) -> Any:
        """Run ``work()`` on rank 0 alone while the other ranks wait outside any collective
        (see ``groups.run_on_main``)."""
        return groups.run_on_main(tag, work, self.timeouts.wait_for_rank0_s,
                                  self.process_group)

    def collect(self, step: int) -> Any:
        """One collection of the plan's rollouts on rank 0, shared with every rank."""
        from agentrl.rollout.runner import CollectionResult

        def work() -> Any:
            if self.collector is not None:  # generated ahead, at most k versions old
                return self.collector.next_collection(step)
            result = self.loop.run_until_complete(
                self.runner.collect(step, self.plan.num_rollouts))
            self.engine.release_memory()  # colocated replicas sleep while training
            return result

        result = self.on_main(f"collection/{step}", work)
        if not groups.is_distributed(self.process_group):
            return result
        payload = msgspec.msgpack.encode(result) if self.is_main else None
        payload = groups.broadcast_object(payload, self.process_group)
        return msgspec.msgpack.decode(payload, type=CollectionResult)

    def validate(self, step: int) -> dict[str, float]:
        """Accuracy per environment on held-out tasks (``eval/<name>/accuracy``), computed
        by rank 0 while the other ranks wait; {} on other ranks. Each task's outcome goes
        to ``RUN_DIR/eval_tasks.jsonl`` (paired comparisons between runs resample them)."""
        from agentrl.rollout.evaluation import accuracy_of

        def work() -> dict[str, float]:
            start = time.perf_counter()
            outcomes = self.evaluate_policy(self.config.train.eval_tasks_per_env)
            if self.eval_log is not None:
                self.eval_log.write({"step": step, "tasks": outcomes})
            figures = {**eval_metrics(accuracy_of(outcomes)),
                       "time/eval": time.perf_counter() - start}
            if isinstance(self.engine, EngineRouter):  # held-out requests: not a step's
                figures.update({f"eval/{k}": v for k, v in self.engine.replica_figures().items()})
            return figures

        return self.on_main(f"validation/{step}", work) or {}

    def evaluate_policy(self, num_tasks: int) -> dict[str, list[float]]:
        """Rank 0: per environment, the correctness of each of ``num_tasks`` held-out
        tasks, by the engine wherever it runs (in the collector's process when it has
        one)."""
        from agentrl.rollout.collector_process import ProcessCollector
        from agentrl.rollout.evaluation import evaluate_tasks

        if isinstance(self.collector, ProcessCollector):
            return self.collector.evaluate(num_tasks)
        return self.run_on_engine_loop(
            lambda: evaluate_tasks(self.engine, self.tokenizer, self.config, num_tasks))

    def write_rollout_sample(self, step: int, rollouts: list[Any], rows: list[Any],
                             advantages: list[float]) -> dict[str, float]:
        """Write the step's sampled transcripts when due (rank 0); returns their cost."""
        if self.rollout_log is None:
            return {}
        figures = self.rollout_log.write(step, rollouts, rows, advantages)
        if figures:  # written: trackers (log.wandb, log.mlflow) get it as a table
            from agentrl.transcripts.store import read_step
            from agentrl.transcripts.table import sample_table

            self.writers.write_samples(step, *sample_table(read_step(self.run_dir, step)))
        return figures

    def first_sync(self) -> None:
        """At start (or resume): replicas that loaded the folder themselves serve version
        ``state.step``; servers started elsewhere are sent the weights (collective). A
        LoRA run always sends its adapter (the replicas loaded only the base)."""
        # rank 0: the replicas, or the collector process that holds them
        serving = self.engine if self.engine is not None else self.collector
        needed = self.config.model.lora is not None or groups.broadcast_object(
            serving.needs_initial_sync if self.is_main else None, self.process_group)
        if needed:
            self.sync_weights(version=self.state.step)
        elif serving is not None:
            serving.adopt_version(self.state.step)

    def sync_weights(self, version: int | None = None) -> None:
        """Push the policy to every inference replica, gathered one parameter at a time in
        the engines' dtype (collective: every rank takes part in each gather; rank 0's
        router buckets and sends them). ``version`` defaults to the served version + 1.
        A LoRA run sends its adapter tensors only."""
        select = is_adapter if self.config.model.lora is not None else None
        tensors = iter_full_parameters(self.model, self.compute_dtype, select)
        if self.collector is not None:  # generating meanwhile: hand over a snapshot
            with groups.one_communicator_at_a_time():  # the gathers, not beside a sync
                snapshot = self.collector.snapshot(tensors)
            self.collector.publish(snapshot, self.state.step if version is None else version)
        elif self.engine is None:
            for _ in tensors:  # ranks 1..N: take part in each gather
                pass
        else:
            self.engine.update_weights(tensors, version)

    def run_on_engine_loop(self, make_coroutine: Any) -> Any:
        """Run an engine-using coroutine (a validation) where the engine runs: on the
        asynchronous collector's loop while it generates (validation then shares the
        engine and its weights, up to max_staleness versions old), else on ``loop``."""
        if self.collector is not None:
            done, result = self.collector.run_on_loop(make_coroutine)
            if done:
                return result
        return self.loop.run_until_complete(make_coroutine())

    def sampler_state(self) -> dict[str, Any]:
        """The sampler state a checkpoint after this step stores: from before the next
        collection drew its tasks (asynchronous collection has already drawn ahead)."""
        if self.collector is not None:
            return self.collector.sampler_state_before(self.state.step + 1)
        return self.sampler.state_dict()

    def record_trained(self, step: int, groups: list[Any]) -> None:
        """One line in ``trained_rollouts.jsonl``: the rollouts ``step`` trained on, with
        their group's environment and task seed and their policy versions (rank 0)."""
        if self.trained_log is not None:
            self.trained_log.write({"step": step, "rollouts": [
                [r.rollout_id, g.env, g.task_seed, [run for seg in r.segments
                                                     for run in seg.version_runs]]
                for g in groups for r in g.rollouts]})

    def close(self) -> None:
        """Stop the collector (discarding in-flight generations), the agent programs'
        endpoint, and close the logs."""
        if self.collector is not None:
            self.collector.close()
        if self.runner is not None and self.runner.endpoint is not None:
            self.runner.endpoint.stop()
        for log in (self.trained_log, self.eval_log):
            if log is not None:
                log.close()
        self.writers.close()


def eval_metrics(accuracy: dict[str, float]) -> dict[str, float]:
    """``eval/<name>/accuracy`` per environment and their mean as ``eval/accuracy``."""
    out = {f"eval/{name}/accuracy": acc for name, acc in sorted(accuracy.items())}
    if accuracy:
        out["eval/accuracy"] = float(np.mean(list(accuracy.values())))
    return out


def build_run(config: Config, run_dir: str | Path, resume: bool = False) -> Run:
    """Join the process group, load or build the sharded model, the engine, runner,
    optimizer and writers of a run.

    With ``resume`` the newest checkpoint in ``run_dir`` provides the weights, optimizer,
    scheduler, sampler, RNG states and counters, so the run continues exactly.
    """
    bound_kernel_caches()  # before the first oneDNN kernel (agentrl train has done it)
    limits = timeouts(config)
    group = groups.init_process_group(limits.collective_s)
    is_main = groups.get_rank(group) == 0
    run_dir = Path(run_dir)
    seed_everything(config.train.seed)
    device = groups.local_device()
    compute = compute_dtype(config.model.dtype, device)
    attention = announce_attention(config.model.attention, compute, device, is_main)
    if config.train.deterministic:  # before any cuBLAS handle exists
        use_deterministic_kernels(on_gpu=device.type == "cuda")
    # rank 0 alone finds (or builds) the model folder and reads the weights, while the
    # other ranks wait outside any collective; then every rank takes its shards
    found = groups.run_on_main("setup/model", lambda: model_folders(config, run_dir, resume),
                               limits.wait_for_rank0_s, group)
    initial_dir, model_dir, checkpoint = groups.broadcast_object(
        found[:3] if is_main else None, group)
    state_dict = found[3] if is_main else {}
    model = load_policy(config, model_dir, state_dict, compute, attention, device)
    del state_dict
    reference = None
    if config.loss.kl_coef != 0.0:  # the initial policy, also when resuming
        initial = groups.run_on_main("setup/reference", lambda: read_model_state(initial_dir),
                                     limits.wait_for_rank0_s, group)
        reference = load_sharded(initial_dir, initial or {}, compute, compute, attention,
                                 device, trained=False)
        reference.requires_grad_(False)
    configure_memory(config, model, reference, device)
    optimizer = build_optimizer(model, config.optim, lr=effective_lr(config))
    scheduler = build_scheduler(optimizer, config.optim)
    sampler = build_sampler(config)
    state = TrainerState()
    if checkpoint is not None:
        state = load_training_state(checkpoint, model, optimizer, scheduler)
        sampler.load_state_dict(state.sampler)
    # rank 0 alone builds the engine replicas (vLLM starts in minutes), the runner and
    # the writers, while the other ranks wait outside any collective
    main_side = groups.run_on_main(
        "setup/engine", lambda: _main_side(config, run_dir, model, model_dir, sampler, state,
                                           resume, group),
        limits.wait_for_rank0_s, group)
    main_parts = main_side or {}
    args = model.config
    cost = CostModel.from_model_args(
        args.hidden_size, args.num_hidden_layers, args.intermediate_size, args.vocab_size,
        num_kv_heads_ratio=args.num_key_value_heads / args.num_attention_heads)
    run = Run(config=config, run_dir=run_dir, model=model, tokenizer_dir=model_dir,
              sampler=sampler, optimizer=optimizer, scheduler=scheduler, state=state,
              plan=plan_batches(config), cost=cost, timeouts=limits, compute_dtype=compute,
              share_prefixes=config.batch.share_prefixes and attention == "torch",
              token_multiple=token_multiple(config.batch.token_multiple, compute, device),
              process_group=group, reference=reference, **main_parts)
    run.first_sync()
    return run


def _main_side(config: Config, run_dir: Path, model: Any, model_dir: Path,
               sampler: EnvironmentSampler, state: TrainerState, resume: bool,
               group: dist.ProcessGroup) -> dict[str, Any]:
    """Rank 0's part of a run, as ``Run`` fields: the tokenizer, the engine replicas, the
    runner, the asynchronous collector (rollout.max_staleness >= 1) and the writers."""
    from agentrl.model import load_tokenizer
    from agentrl.rollout.template_check import prepare_chat

    tokenizer = load_tokenizer(model_dir)
    print(prepare_chat(tokenizer, config.model).describe(), flush=True)
    engine = runner = collector = None
    if config.rollout.max_staleness > 0 and config.rollout.collector == "process":
        from agentrl.rollout.collector_process import ProcessCollector

        collector = ProcessCollector(config, model_dir, state.sampler or sampler.state_dict(),
                                     state.step + 1,
                                     num_training_gpus=training_gpus_here(group))
    else:
        engine = build_engine(config, model, tokenizer, model_dir,
                              num_training_gpus=training_gpus_here(group))
        runner = build_runner(config, engine, tokenizer, sampler)
        if config.rollout.max_staleness > 0:
            collector = build_collector(config, runner, sampler, state.step + 1,
                                        state.sampler.get("carry_over"))
        else:  # a checkpoint's carried-over groups would be lost
            check_resumable(state.sampler.get("carry_over"), state.step + 1, False)
    write_run_config(config, run_dir)
    resume_step = state.step if resume else None
    writers = build_writers(run_dir, config.train.num_steps, config.log.live,
                            config.log.tensorboard, resume_step=resume_step)
    writers.writers += tracking_writers(config.log, run_dir, msgspec.to_builtins(config),
                                        resume)
    return {
        "tokenizer": tokenizer, "engine": engine, "runner": runner, "collector": collector,
        "writers": writers,
        "rollout_log": build_rollout_log(config, run_dir, tokenizer, resume_step),
        "trained_log": JsonlWriter(run_dir / TRAINED_ROLLOUTS_FILE, resume_step=resume_step),
        "eval_log": JsonlWriter(run_dir / EVAL_TASKS_FILE, resume_step=resume_step),
    }

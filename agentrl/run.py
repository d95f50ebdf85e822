"""Setting up a training run: model, engine, runner, optimizer, writers, ranks.

:func:`build_run` is the one place a run is assembled; ``agentrl.trainer`` only runs it.
With data parallelism (``train.num_ranks > 1``) every rank holds the model and its
optimizer, and rank 0 alone holds the inference engine, the runner, the writers and the
checkpoints: it collects each step's rollouts and broadcasts them, every rank trains on
its share of the rows, and the summed gradients keep all ranks' weights identical.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from agentrl import distributed
from agentrl.accounting import BatchPlan, plan_batches
from agentrl.checkpoint import TrainerState, latest_checkpoint, load_training_state
from agentrl.config import Config
from agentrl.metric_writers import JsonlWriter, MultiWriter, build_writers
from agentrl.packing import CostModel
from agentrl.sampler import EnvironmentSampler
from agentrl.schedule import build_optimizer, build_scheduler, effective_lr

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRAINED_ROLLOUTS_FILE = "trained_rollouts.jsonl"


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
    """The inference engine (rank 0 only; None on other ranks)."""
    runner: Any
    sampler: EnvironmentSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    writers: Any
    state: TrainerState
    plan: BatchPlan
    cost: CostModel
    process_group: dist.ProcessGroup | None = None
    reference: Any = None
    """Frozen initial model for the KL term (only when loss.kl_coef != 0)."""
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    collector: Any = None
    """The asynchronous collector (rollout.max_staleness >= 1, rank 0), else None."""
    eval_engine: Any = None
    """The engine validations use, on ``loop`` (the engine itself when None)."""
    rollout_log: Any = None
    """``RUN_DIR/trained_rollouts.jsonl``: what every step trained (rank 0)."""

    @property
    def rank(self) -> int:
        """This process's data-parallel rank (0 on one process)."""
        return distributed.get_rank(self.process_group)

    @property
    def world_size(self) -> int:
        """Data-parallel ranks (1 on one process)."""
        return distributed.get_world_size(self.process_group)

    @property
    def is_main(self) -> bool:
        """Rank 0: generates, writes metrics and checkpoints."""
        return self.rank == 0

    def collect(self, step: int) -> Any:
        """One collection of the plan's rollouts on rank 0, shared with every rank."""
        from agentrl.rollout.runner import CollectionResult

        result = None
        if self.is_main and self.collector is not None:
            result = self.collector.next_collection(step)
        elif self.is_main:
            result = self.loop.run_until_complete(
                self.runner.collect(step, self.plan.num_rollouts))
        if not distributed.is_distributed(self.process_group):
            return result
        box = [msgspec.msgpack.encode(result) if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.process_group)
        return msgspec.msgpack.decode(box[0], type=CollectionResult)

    def validate(self) -> dict[str, float]:
        """Accuracy per environment on held-out tasks (``eval/<name>/accuracy``); rank 0."""
        from agentrl.evaluation import evaluate

        if not self.is_main:
            return {}
        start = time.perf_counter()
        accuracy = self.loop.run_until_complete(
            evaluate(self.eval_engine or self.engine, self.tokenizer, self.config,
                     self.config.train.eval_tasks_per_env)
        )
        return {**eval_metrics(accuracy), "time/eval": time.perf_counter() - start}

    def sync_weights(self, version: int) -> None:
        """Give the engine the policy of ``version`` (steps trained): through the
        asynchronous collector, by copy, or nothing to copy for a torch engine sharing
        the trainer's model."""
        if self.engine is None:
            return
        if self.collector is not None:
            self.collector.publish(self.model.state_dict().items(), version)
            return
        if getattr(self.engine, "model", None) is not self.model:
            self.engine.update_weights(self.model.state_dict())
        self.engine.weight_version = version

    def sampler_state(self) -> dict[str, Any]:
        """The sampler state a checkpoint after this step stores: from before the next
        collection drew its tasks (asynchronous collection has already drawn ahead)."""
        if self.collector is not None:
            return self.collector.sampler_state_before(self.state.step + 1)
        return self.sampler.state_dict()

    def record_trained(self, step: int, groups: list[Any]) -> None:
        """One line in ``trained_rollouts.jsonl``: the rollouts ``step`` trained on, with
        their group's environment and task seed and their policy versions."""
        if self.rollout_log is not None:
            self.rollout_log.write({"step": step, "rollouts": [
                [r.rollout_id, g.env, g.task_seed, [run for seg in r.segments
                                                     for run in seg.version_runs]]
                for g in groups for r in g.rollouts]})

    def close(self) -> None:
        """Stop the collector (discarding in-flight generations) and close the logs."""
        if self.collector is not None:
            self.collector.close()
        if self.rollout_log is not None:
            self.rollout_log.close()
        self.writers.close()


def eval_metrics(accuracy: dict[str, float]) -> dict[str, float]:
    """``eval/<name>/accuracy`` per environment and their mean as ``eval/accuracy``."""
    out = {f"eval/{name}/accuracy": acc for name, acc in sorted(accuracy.items())}
    if accuracy:
        out["eval/accuracy"] = float(np.mean(list(accuracy.values())))
    return out


def build_run(
    config: Config, run_dir: str | Path, resume: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Run:
    """Load or build the model, engine, runner, optimizer and writers of a run.

    With ``resume`` the newest checkpoint in ``run_dir`` provides the weights, optimizer,
    scheduler, sampler, RNG states and counters, so the run continues exactly.
    """
    from agentrl.model import load_pretrained, load_tokenizer

    run_dir = Path(run_dir)
    is_main = distributed.get_rank(process_group) == 0
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ValueError(f"--resume: {run_dir} holds no complete checkpoint; drop --resume "
                         "to start a new run there")
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.train.seed)
    initial_dir = resolve_model_dir(config, run_dir)
    model_dir = checkpoint or initial_dir
    dtype = getattr(torch, config.model.dtype)
    device = training_device()
    model = load_pretrained(model_dir, dtype=dtype, attention=config.model.attention,
                            device=device)
    reference = None
    if config.loss.kl_coef != 0.0:  # the initial policy, also when resuming
        reference = load_pretrained(initial_dir, dtype=dtype, attention=config.model.attention,
                                    device=device)
        reference.requires_grad_(False)
    model = distributed.wrap_model(model, process_group)
    tokenizer = load_tokenizer(model_dir)
    optimizer = build_optimizer(model, config.optim, lr=effective_lr(config))
    scheduler = build_scheduler(optimizer, config.optim)
    sampler = EnvironmentSampler(
        {env.display_name(): env.weight for env in config.environments}, config.train.seed
    )
    state = TrainerState()
    if checkpoint is not None:
        state = load_training_state(checkpoint, optimizer, scheduler)
        sampler.load_state_dict(state.sampler)
    main_parts: dict[str, Any] = {"engine": None, "runner": None, "writers": MultiWriter([])}
    if is_main:
        main_parts = build_main_parts(config, model, tokenizer, model_dir, sampler, state,
                                      run_dir, resume)
    args = model.config
    cost = CostModel.from_model_args(
        args.hidden_size, args.num_hidden_layers, args.intermediate_size, args.vocab_size,
        num_kv_heads_ratio=args.num_key_value_heads / args.num_attention_heads)
    return Run(config=config, run_dir=run_dir, model=model, tokenizer=tokenizer,
               tokenizer_dir=Path(model_dir), sampler=sampler, optimizer=optimizer,
               scheduler=scheduler, state=state, plan=plan_batches(config), cost=cost,
               process_group=process_group, reference=reference, **main_parts)


def build_main_parts(config: Config, model: Any, tokenizer: Any, model_dir: Path,
                     sampler: EnvironmentSampler, state: TrainerState, run_dir: Path,
                     resume: bool) -> dict[str, Any]:
    """What rank 0 alone holds: the engine, the runner, the asynchronous collector (with
    its own copy of the policy) and the writers, as ``Run`` fields."""
    asynchronous = config.rollout.max_staleness > 0
    # with k >= 1 the trainer changes its weights while the engine generates: the engine
    # gets its own copy, synced after every step; validations use the trainer's weights
    engine = build_engine(config, copy.deepcopy(model) if asynchronous else model,
                          tokenizer, model_dir)
    engine.weight_version = state.step
    runner = build_runner(config, engine, tokenizer, sampler)
    parts: dict[str, Any] = {"engine": engine, "runner": runner}
    if asynchronous:
        parts["eval_engine"] = build_engine(config, model, tokenizer, model_dir)
        parts["collector"] = build_collector(config, runner, sampler, state.step + 1)
    write_run_config(config, run_dir)
    resume_step = state.step if resume else None
    parts["writers"] = build_writers(run_dir, config.train.num_steps, config.log.live,
                                     config.log.tensorboard, resume_step=resume_step)
    parts["rollout_log"] = JsonlWriter(run_dir / TRAINED_ROLLOUTS_FILE, resume_step=resume_step)
    return parts


def training_device() -> torch.device:
    """This rank's GPU when there is one (NCCL init already picked it), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
    if config.compaction.strategy != "none":
        max_len = config.compaction.max_context_tokens + rollout.max_new_tokens + 1
    else:
        max_len = rollout.max_rollout_tokens + 2048  # generated tokens + prompt/observations
    max_len = min(max_len, model.config.max_position_embeddings)
    if rollout.engine == "vllm":
        from agentrl.rollout.vllm_engine import VLLMEngine

        args = {"gpu_memory_utilization": 0.5, "max_model_len": max_len, **rollout.vllm_args}
        return VLLMEngine.from_pretrained(str(model_dir), dtype=config.model.dtype,
                                          seed=config.train.seed, **args)
    from agentrl.rollout.torch_engine import TorchEngine

    return TorchEngine(model, tokenizer, max_batch_size=rollout.max_concurrent_rollouts,
                       max_len=max_len, seed=config.train.seed)


def build_collector(config: Config, runner: Any, sampler: EnvironmentSampler,
                    first_step: int) -> Any:
    """The asynchronous collector producing steps ``first_step ..`` (max_staleness >= 1)."""
    from agentrl.rollout.async_collector import AsyncCollector

    return AsyncCollector(runner, sampler, plan_batches(config).num_rollouts,
                          config.rollout.max_staleness, first_step, config.train.num_steps,
                          inflight_updates=config.rollout.inflight_updates)


def build_runner(config: Config, engine: Any, tokenizer: Any,
                 sampler: EnvironmentSampler) -> Any:
    """The rollout runner over the configured environments."""
    from agentrl.rollout.runner import RolloutRunner

    return RolloutRunner(config, engine, tokenizer, sampler)


def write_run_config(config: Config, run_dir: Path) -> None:
    """Keep the resolved config next to the metrics (what exactly ran)."""
    (run_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))

"""Setting up a training run: process group, sharded model, engine, runner, optimizer.

:func:`build_run` is the one place a run is assembled; ``agentrl.trainer`` only runs it.
Every process is a rank of a process group (a group of one without torchrun). The policy
is sharded with FSDP2 over all ranks: fp32 master weights and AdamW state, compute in
``model.dtype``. Rank 0 alone also holds the inference engine (with its own copy of the
weights in the compute dtype, refreshed after every step), the runner, the writers and
the checkpoint files: it collects each step's rollouts and broadcasts them, every rank
trains on its share of the rows, and FSDP2 sums the gradients over ranks.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from agentrl.accounting import BatchPlan, plan_batches
from agentrl.checkpoint import TrainerState, latest_checkpoint, load_training_state
from agentrl.config import Config
from agentrl.metric_writers import MultiWriter, build_writers
from agentrl.packing import CostModel
from agentrl.parallel import groups
from agentrl.parallel.fsdp import iter_full_parameters, load_sharded
from agentrl.parallel.timeouts import Timeouts, timeouts
from agentrl.sampler import EnvironmentSampler
from agentrl.schedule import build_optimizer, build_scheduler

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    """Everything a training run holds, built once by :func:`build_run`."""

    config: Config
    run_dir: Path
    model: Any
    """The policy, FSDP2-sharded over all ranks (fp32 master weights)."""
    tokenizer: Any
    """Rank 0 only (None on other ranks)."""
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
    timeouts: Timeouts
    compute_dtype: torch.dtype
    process_group: dist.ProcessGroup | None = None
    reference: Any = None
    """Frozen initial model for the KL term (only when loss.kl_coef != 0), sharded."""
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    rollout_log: Any = None
    """Writes sampled rollouts as transcripts (rank 0 only; None elsewhere)."""

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

        result = self.on_main(f"collection/{step}", lambda: self.loop.run_until_complete(
            self.runner.collect(step, self.plan.num_rollouts)))
        if not groups.is_distributed(self.process_group):
            return result
        payload = msgspec.msgpack.encode(result) if self.is_main else None
        payload = groups.broadcast_object(payload, self.process_group)
        return msgspec.msgpack.decode(payload, type=CollectionResult)

    def validate(self, step: int) -> dict[str, float]:
        """Accuracy per environment on held-out tasks (``eval/<name>/accuracy``), computed
        by rank 0 while the other ranks wait; {} on other ranks."""
        from agentrl.evaluation import evaluate

        def work() -> dict[str, float]:
            start = time.perf_counter()
            accuracy = self.loop.run_until_complete(
                evaluate(self.engine, self.tokenizer, self.config,
                         self.config.train.eval_tasks_per_env))
            return {**eval_metrics(accuracy), "time/eval": time.perf_counter() - start}

        return self.on_main(f"validation/{step}", work) or {}

    def write_rollout_sample(self, step: int, rollouts: list[Any], rows: list[Any],
                             advantages: list[float]) -> dict[str, float]:
        """Write the step's sampled transcripts when due (rank 0); returns their cost."""
        if self.rollout_log is None:
            return {}
        return self.rollout_log.write(step, rollouts, rows, advantages)

    def sync_weights(self) -> None:
        """Give rank 0's engine the new policy, gathered one parameter at a time in the
        compute dtype (collective: every rank takes part in each gather)."""
        tensors = iter_full_parameters(self.model, self.compute_dtype)
        if self.engine is None:
            for _ in tensors:  # ranks 1..N: take part in each gather
                pass
            return
        self.engine.update_weights(dict(tensors))


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
    from agentrl.model import load_tokenizer

    limits = timeouts(config)
    group = groups.init_process_group(limits.collective_s)
    is_main = groups.get_rank(group) == 0
    run_dir = Path(run_dir)
    seed_everything(config.train.seed)
    device = groups.local_device()
    compute = compute_dtype(config.model.dtype, device)
    attention = announce_attention(config.model.attention, compute, device, is_main)
    # rank 0 alone finds (or builds) the model folder and reads the weights, while the
    # other ranks wait outside any collective; then every rank takes its shards
    found = groups.run_on_main("setup/model", lambda: _model_folders(config, run_dir, resume),
                               limits.wait_for_rank0_s, group)
    initial_dir, model_dir, checkpoint = groups.broadcast_object(
        found[:3] if is_main else None, group)
    state_dict = found[3] if is_main else {}
    model = load_sharded(model_dir, state_dict, torch.float32, compute, attention, device)
    del state_dict
    reference = None
    if config.loss.kl_coef != 0.0:  # the initial policy, also when resuming
        initial = groups.run_on_main("setup/reference", lambda: read_model_state(initial_dir),
                                     limits.wait_for_rank0_s, group)
        reference = load_sharded(initial_dir, initial or {}, compute, compute, attention,
                                 device)
        reference.requires_grad_(False)
    optimizer = build_optimizer(model, config.optim)
    scheduler = build_scheduler(optimizer, config.optim)
    sampler = EnvironmentSampler(
        {env.display_name(): env.weight for env in config.environments}, config.train.seed
    )
    state = TrainerState()
    if checkpoint is not None:
        state = load_training_state(checkpoint, model, optimizer, scheduler)
        sampler.load_state_dict(state.sampler)
    tokenizer = engine = runner = rollout_log = None
    writers: Any = MultiWriter([])
    if is_main:
        tokenizer = load_tokenizer(model_dir)
        engine = build_engine(config, load_engine_model(config, model_dir, compute, attention,
                                                        device), tokenizer, model_dir)
        runner = build_runner(config, engine, tokenizer, sampler)
        write_run_config(config, run_dir)
        writers = build_writers(run_dir, config.train.num_steps, config.log.live,
                                config.log.tensorboard,
                                resume_step=state.step if resume else None)
        rollout_log = build_rollout_log(config, run_dir, tokenizer,
                                        resume_step=state.step if resume else None)
    args = model.config
    cost = CostModel.from_model_args(
        args.hidden_size, args.num_hidden_layers, args.intermediate_size, args.vocab_size,
        num_kv_heads_ratio=args.num_key_value_heads / args.num_attention_heads)
    return Run(config=config, run_dir=run_dir, model=model, tokenizer=tokenizer,
               tokenizer_dir=model_dir, engine=engine, runner=runner, sampler=sampler,
               optimizer=optimizer, scheduler=scheduler, writers=writers, state=state,
               plan=plan_batches(config), cost=cost, timeouts=limits, compute_dtype=compute,
               process_group=group, reference=reference,
               rollout_log=rollout_log)


def _model_folders(config: Config, run_dir: Path, resume: bool
                   ) -> tuple[Path, Path, Path | None, dict[str, torch.Tensor]]:
    """Rank 0: (initial model folder, folder to load, checkpoint or None, its weights)."""
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ValueError(f"--resume: {run_dir} holds no complete checkpoint; drop --resume "
                         "to start a new run there")
    run_dir.mkdir(parents=True, exist_ok=True)
    initial_dir = resolve_model_dir(config, run_dir)
    model_dir = Path(checkpoint or initial_dir)
    return initial_dir, model_dir, checkpoint, read_model_state(model_dir)


def read_model_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """The checked weights of a Hugging Face folder, in fp32, on this CPU."""
    from agentrl.model import read_args
    from agentrl.model.checkpoint import read_checkpoint_state

    state = read_checkpoint_state(model_dir, read_args(model_dir))
    return {k: v.float() for k, v in state.items()}


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """``model.dtype`` as a torch dtype; "auto" is bfloat16 on a GPU, float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def announce_attention(choice: str, dtype: torch.dtype, device: torch.device,
                       is_main: bool) -> str:
    """The attention backend to build the model with; rank 0 says once which and why."""
    from agentrl.model.attention import choose_backend

    backend, why = choose_backend(choice, dtype, device)
    if is_main:
        print(f"attention: {why}", flush=True)
    return backend


def load_engine_model(config: Config, model_dir: Path, dtype: torch.dtype, attention: str,
                      device: torch.device) -> Any:
    """The engine's own copy of the policy in the compute dtype (vLLM loads its own)."""
    from agentrl.model import load_pretrained

    if config.rollout.engine == "vllm":
        return None
    return load_pretrained(model_dir, dtype=dtype, attention=attention, device=device).eval()


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (a resume then restores the saved states over these)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_model_dir(config: Config, run_dir: Path) -> Path:
    """The model folder: ``model.path`` (relative to the working directory or the project),
    or a tiny built-in checkpoint built once into ``RUN_DIR/base_model``."""
    if config.model.path:
        from agentrl.preflight import locate_model_dir

        return locate_model_dir(config.model.path)
    from agentrl.model import build_tiny_checkpoint

    tiny = run_dir / "base_model"
    if not (tiny / "config.json").exists():
        build_tiny_checkpoint(tiny, seed=config.train.seed)
    return tiny


def build_engine(config: Config, model: Any, tokenizer: Any, model_dir: Path) -> Any:
    """The inference engine: the torch engine over ``model`` (its own copy, never the
    trainer's sharded module), or vLLM loading ``model_dir`` itself."""
    from agentrl.model import read_args

    rollout = config.rollout
    if config.compaction.strategy != "none":
        max_len = config.compaction.max_context_tokens + rollout.max_new_tokens + 1
    else:
        max_len = rollout.max_rollout_tokens + 2048  # generated tokens + prompt/observations
    max_len = min(max_len, read_args(Path(model_dir)).max_position_embeddings)
    if rollout.engine == "vllm":
        from agentrl.rollout.vllm_engine import VLLMEngine

        dtype = compute_dtype(config.model.dtype, groups.local_device())
        args = {"gpu_memory_utilization": 0.5, "max_model_len": max_len, **rollout.vllm_args}
        return VLLMEngine.from_pretrained(str(model_dir), dtype=str(dtype).removeprefix("torch."),
                                          seed=config.train.seed, **args)
    from agentrl.rollout.torch_engine import TorchEngine

    return TorchEngine(model, tokenizer, max_batch_size=rollout.max_concurrent_rollouts,
                       max_len=max_len, seed=config.train.seed,
                       batch_invariant=config.train.deterministic)


def build_runner(config: Config, engine: Any, tokenizer: Any,
                 sampler: EnvironmentSampler) -> Any:
    """The rollout runner over the configured environments."""
    from agentrl.rollout.runner import RolloutRunner

    return RolloutRunner(config, engine, tokenizer, sampler)


def build_rollout_log(config: Config, run_dir: Path, tokenizer: Any,
                      resume_step: int | None) -> Any:
    """The writer of sampled rollout transcripts (``RUN_DIR/rollouts/``)."""
    from agentrl.transcripts.store import RolloutSampleWriter

    log = config.log
    return RolloutSampleWriter(run_dir, tokenizer, log.rollouts_every,
                               log.rollouts_random_per_env, config.train.seed, resume_step)


def write_run_config(config: Config, run_dir: Path) -> None:
    """Keep the resolved config next to the metrics (what exactly ran)."""
    (run_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))

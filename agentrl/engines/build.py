"""Building the inference side of a run: local replicas, remote replicas, one router.

:func:`build_engines` is what ``agentrl.train.run`` calls. Local replicas own their model (a
built-in ``TorchEngine`` loads its own copy of the checkpoint; vLLM runs in its own
processes), so generation never touches the trainer's (possibly sharded) parameters.
Placement decides their GPUs (:func:`replica_gpus`); :func:`engine_memory` gives the
memory plan the engine's share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import torch

from agentrl.config import Config, num_local_engines
from agentrl.engines.router import EngineRouter
from agentrl.model.kv_cache import cache_dtype, kv_cache_bytes

SUMMARY_REQUEST_TOKENS = 256
"""Room for the summary request message (``agentrl.rollout.compaction.SUMMARY_REQUEST``,
under 200 bytes rendered: at most one token per byte, whatever the tokenizer)."""


def engine_max_len(config: Config, max_position_embeddings: int) -> int:
    """Tokens one request may hold (prompt + generated): the compaction budget plus a
    turn (plus the summary request and the summary, when the budget asks for one), or
    the longest thread's budget (the main thread's, or a subagent's) plus room for
    prompts and observations."""
    rollout, compaction = config.rollout, config.compaction
    if compaction.strategy != "none":
        max_len = compaction.max_context_tokens + rollout.max_new_tokens + 1
        if compaction.asks_for_summary:
            max_len += SUMMARY_REQUEST_TOKENS + compaction.summary_max_tokens
    else:
        max_len = max(rollout.max_rollout_tokens, rollout.max_subagent_tokens) + 2048
    return min(max_len, max_position_embeddings)


def max_request_row(config: Config, max_position_embeddings: int) -> int:
    """Tokens of the longest row one request can make, prompt + generated: the built-in
    engine takes a prompt of up to max_len - 1 tokens and generates while its slot holds
    the tokens fed back, so the row reaches max_len + 1 (its last sampled token is never
    fed back); vLLM stops at max_len. What bounds a row whose prompt nothing of ours
    compacts (a harness program's request)."""
    return engine_max_len(config, max_position_embeddings) + 1


def replica_gpus(index: int, placement: str, tensor_parallel_size: int,
                 num_training_gpus: int, num_gpus: int) -> list[int]:
    """GPU indices (as this process sees them) of local replica ``index``: after the
    training GPUs when "separate", on them when "colocated"; ValueError when the machine
    has too few."""
    first = index * tensor_parallel_size + (num_training_gpus if placement == "separate" else 0)
    gpus = list(range(first, first + tensor_parallel_size))
    limit = num_gpus if placement == "separate" else max(num_training_gpus, 1)
    if gpus[-1] >= limit:
        where = (f"{num_gpus} GPUs with {num_training_gpus} training" if placement == "separate"
                 else f"{num_training_gpus} training GPUs")
        raise ValueError(f'rollout.placement = "{placement}": replica {index} needs GPUs '
                         f"{gpus} but there are {where}; lower rollout.num_engines or "
                         "tensor_parallel_size, or change the placement")
    return gpus


def engine_dtype(config: Config) -> torch.dtype:
    """The dtype replicas compute in: the training compute dtype (``model.dtype``)."""
    from agentrl.parallel.fsdp import compute_dtype
    from agentrl.parallel.groups import local_device

    return compute_dtype(config.model.dtype, local_device())


def build_engines(config: Config, model_dir: str | Path, tokenizer: Any,
                  max_position_embeddings: int, num_training_gpus: int = 1,
                  dtype: torch.dtype | None = None) -> EngineRouter:
    """The router over this run's replicas (local ones started here, remote ones checked);
    ``dtype``: the replicas' dtype (default :func:`engine_dtype`), also the dtype the
    router sends weights in."""
    rollout = config.rollout
    dtype = dtype or engine_dtype(config)
    max_len = engine_max_len(config, max_position_embeddings)
    replicas: list[Any] = []
    for index in range(num_local_engines(rollout)):
        gpus: list[int] = []
        if torch.cuda.is_available():
            gpus = replica_gpus(index, rollout.placement, rollout.tensor_parallel_size,
                                num_training_gpus, torch.cuda.device_count())
        if rollout.engine == "vllm":
            replicas.append(_vllm_replica(config, model_dir, max_len, gpus, index, dtype))
        else:
            replicas.append(build_torch_replica(config, model_dir, tokenizer, max_len, gpus,
                                                index, dtype))
    for url in rollout.remote_engines:
        from agentrl.engines.remote import RemoteEngine

        replicas.append(RemoteEngine(
            url, request_timeout_s=rollout.request_timeout_s,
            sync_timeout_s=rollout.weight_sync_timeout_s,
            transport=rollout.weight_transport,
            advertise_host=rollout.weight_sync_host).connect())
    # placement concerns the replicas started here: servers elsewhere (remote_engines
    # alone) hold no memory the trainer could use, so they are never put to sleep
    colocated = rollout.placement == "colocated" and num_local_engines(rollout) > 0
    return EngineRouter(replicas, colocated=colocated,
                        sleep_level=rollout.sleep_level,
                        bucket_bytes=rollout.weight_sync_bucket_mb * 2**20,
                        weight_dtype=dtype)


def build_torch_replica(config: Config, model_dir: str | Path, tokenizer: Any, max_len: int,
                        gpus: list[int], index: int, dtype: torch.dtype) -> Any:
    """A built-in engine replica with its own copy of the checkpoint (on ``gpus[0]``, or
    the CPU when ``gpus`` is empty)."""
    from agentrl.engines.torch_engine import TorchEngine
    from agentrl.model import load_pretrained
    from agentrl.model.compile import compile_model

    device = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
    model = load_pretrained(model_dir, dtype=dtype, attention=config.model.attention,
                            device=device).eval()
    model.requires_grad_(False)
    # a LoRA replica stays eager: its adapter versions are forward hooks reading a dict
    # of live versions, which compiled code would guard on and recompile at every sync
    compile_model(model, config.model.compile and config.model.lora is None)
    name = f"local replica {index}"
    adapters = None
    if config.model.lora is not None:  # the frozen base, plus adapter versions as synced
        from agentrl.engines.adapters import AdapterVersions

        adapters = AdapterVersions(model, config.model.lora, name,
                                   move_running=config.rollout.inflight_updates)
    engine = TorchEngine(model, tokenizer, max_batch_size=config.rollout.max_concurrent_rollouts,
                         max_len=max_len, seed=config.train.seed + 7919 * index,
                         batch_invariant=config.train.deterministic, name=name,
                         adapters=adapters)
    engine.sync_timeout_s = config.rollout.weight_sync_timeout_s
    return engine


def _vllm_replica(config: Config, model_dir: str | Path, max_len: int, gpus: list[int],
                  index: int, dtype: torch.dtype) -> Any:
    from agentrl.engines.vllm_engine import VLLMEngine

    rollout = config.rollout
    args: dict[str, Any] = {"gpu_memory_utilization": 0.5, "max_model_len": max_len,
                            **rollout.vllm_args}
    if rollout.tensor_parallel_size > 1:
        args["tensor_parallel_size"] = rollout.tensor_parallel_size
    transport = rollout.weight_transport
    if transport == "auto" and gpus:  # NCCL cannot join two ranks on one GPU: IPC there
        transport = "ipc" if rollout.placement == "colocated" else "nccl"
    return VLLMEngine.from_pretrained(
        str(model_dir), dtype=str(dtype).removeprefix("torch."), seed=config.train.seed + index,
        weight_transport=transport, sleep_mode=rollout.placement == "colocated", gpus=gpus or None,
        sync_timeout_s=args.pop("sync_timeout_s", rollout.weight_sync_timeout_s),
        name=f"local vLLM replica {index}", lora=config.model.lora,
        max_adapter_versions=rollout.max_staleness + 2, **args)


class EngineMemory(msgspec.Struct, frozen=True):
    """The inference side's memory, for the memory plan (bytes per replica)."""

    num_local_replicas: int
    gpus_per_replica: int
    colocated: bool
    """True: the replicas share the training GPUs (asleep while training, so their
    memory is needed only outside the training phase)."""
    weight_bytes_per_replica: int
    """Model weights in the engine dtype, split over the replica's GPUs."""
    kv_cache_bytes_per_replica: int
    """The built-in engine's KV cache (max_concurrent_rollouts × max_len tokens); for vLLM
    0: vLLM takes gpu_memory_utilization of each GPU it is given instead."""
    vllm_gpu_memory_fraction: float | None
    """vLLM replicas: the fraction of each GPU they claim (None for the built-in engine)."""


def engine_memory(config: Config, num_parameters: int, num_layers: int, num_kv_heads: int,
                  head_dim: int, max_position_embeddings: int,
                  itemsize: int | None = None) -> EngineMemory:
    """What the configured replicas hold in memory (see :class:`EngineMemory`);
    ``itemsize``: bytes per value (default: this machine's engine dtype, and for the KV
    cache the dtype it caches in there)."""
    from agentrl.parallel.groups import local_device

    rollout = config.rollout
    kv_itemsize = itemsize or cache_dtype(engine_dtype(config), local_device()).itemsize
    itemsize = itemsize or engine_dtype(config).itemsize
    tp = rollout.tensor_parallel_size
    kv = 0
    fraction = None
    if rollout.engine == "vllm":
        fraction = float(rollout.vllm_args.get("gpu_memory_utilization", 0.5))
    else:
        max_len = engine_max_len(config, max_position_embeddings)
        kv = kv_cache_bytes(num_layers, rollout.max_concurrent_rollouts, max_len,
                            num_kv_heads, head_dim, kv_itemsize)
    return EngineMemory(
        num_local_replicas=num_local_engines(rollout), gpus_per_replica=tp,
        colocated=rollout.placement == "colocated",
        weight_bytes_per_replica=num_parameters * itemsize // tp,
        kv_cache_bytes_per_replica=kv, vllm_gpu_memory_fraction=fraction)

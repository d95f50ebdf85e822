"""Rollout and compaction settings (``[rollout]``, ``[compaction]``).

Units and ranges: see ``agentrl.config.settings``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from agentrl.config.ranges import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    fix,
)
from agentrl.config.section import _Section


class RolloutConfig(_Section):
    engine: Literal["torch", "vllm"] = "torch"
    """Inference engine: the built-in PyTorch engine (CPU) or vLLM (GPU, extra `gpu`)."""
    temperature: Annotated[NonNegativeFloat, fix("use 0 for greedy decoding")] = 1.0
    """Sampling temperature (logits are divided by it); >= 0, 0 is greedy."""
    top_p: Annotated[Probability, fix("use 1.0 to sample from the whole distribution")] = 1.0
    """Nucleus sampling: draw from the smallest set of tokens holding this probability
    mass; (0, 1], 1.0 keeps every token."""
    max_new_tokens: PositiveInt = 256
    """Generated tokens per turn; >= 1, and below the model's max_position_embeddings."""
    max_turns: PositiveInt = 8
    """Model turns per rollout; >= 1."""
    max_rollout_tokens: PositiveInt = 2048
    """Generated tokens of a rollout's main thread, over all its turns and segments; >= 1
    (subagent threads have max_subagent_tokens each). Without compaction a thread is one
    row, so prompt + this must fit the model's positions."""
    max_subagent_depth: NonNegativeInt = 1
    """Levels of subagents below the main thread (``@subagent`` tools): 1 lets the main
    thread start subagents, 2 lets those start their own, ...; >= 0. A call past it gets an
    error result (``subagent_failures/depth_limit``) and starts nothing; 0 turns them off."""
    max_subagents_per_rollout: NonNegativeInt = 8
    """Subagent threads one rollout may start, over all depths (threads, not calls
    refused); >= 0. Calls past it get an error result (``subagent_failures/count_limit``).
    Several calls of one turn run concurrently."""
    max_subagent_tokens: PositiveInt = 512
    """Generated tokens of one subagent thread, over its turns and segments; >= 1 (a
    ``@subagent(max_tokens=...)`` may lower it). A thread out of tokens returns an error
    result to its parent (``subagent_failures/max_tokens``). A rollout generates at most
    max_rollout_tokens + max_subagents_per_rollout x max_subagent_tokens tokens."""
    step_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 30.0
    """Seconds one environment call (reset, tool_schemas, step, close) may take before the
    rollout is marked invalid, counted from the call's own start (never time spent
    waiting for a worker); > 0. The constructor gets rollout_timeout_s."""
    rollout_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 600.0
    """Seconds one whole rollout may take; > 0."""
    max_concurrent_rollouts: PositiveInt = 64
    """Rollouts in flight at once (the torch engine's batch slots); >= 1."""
    max_retries: NonNegativeInt = 2
    """Extra attempts of a rollout that failed for infrastructure reasons (a server down
    or full, a disconnect, a worker that died, a replica out of service, a constructor or
    reset that raised, any failure before the policy generated a token; docs/robustness.md),
    each from the same task, in the same group, with a fresh environment; >= 0. Only when
    they run out is the rollout masked (``invalid/<kind>``) and its task named in a
    warning."""
    ambiguous_failures: Literal["mask", "retry", "keep"] = "mask"
    """A failure whose cause cannot be told (a step that raised or timed out after the
    policy acted, a rollout timeout, a contract broken after an action, ...): "mask"
    (invalid, counted), "retry" (as infrastructure) or "keep" (trained, with the reward
    earned so far or failure_rewards[kind])."""
    failure_rewards: dict[str, float] = {}
    """The reward a policy-caused failure trains with, by kind (``max_rollout_tokens``,
    ``context_budget``, ``max_compactions``, ``tool_errors``, ``harness_budget``, and with
    ambiguous_failures = "keep" the ambiguous kinds), e.g. ``{ max_rollout_tokens =
    -1.0 }``: a fixed penalty; a kind not listed keeps the environment's reward."""
    max_tool_errors: PositiveInt | None = None
    """Failed tool calls (malformed, unknown tool, bad arguments: the step's
    ``info["tool_errors"]``) a rollout may make; past it the rollout ends, truncated with
    reason "tool_errors" (a policy-caused failure: trained). None: no limit."""
    vllm_args: dict[str, Any] = {}
    """engine = "vllm": keyword arguments for ``VLLMEngine.from_pretrained`` and vLLM's
    engine args, e.g. ``{ gpu_memory_utilization = 0.5 }`` (the default: the trainer
    shares the GPU), ``enforce_eager``, ``kv_cache_memory_bytes``."""
    filter_uniform_groups: bool = False
    """Dynamic sampling: drop groups whose rewards are all equal and collect more."""
    max_extra_collections: NonNegativeInt = 4
    """With filter_uniform_groups: extra collection rounds before falling back to
    training on what was kept (with a warning); >= 0."""
    max_observation_chars: PositiveInt = 100_000
    """Characters of content one reset or step may return (all its messages together);
    >= 1. An environment that returns more breaks its contract: that rollout is invalid
    (``bad_observation``). Tools of an AgentEnv are cut well below it, with a marker."""
    num_engines: NonNegativeInt | None = None
    """Inference replicas the trainer starts itself (engines): each a TorchEngine with its
    own copy of the model, or a vLLM engine of tensor_parallel_size GPUs. Rollouts are
    spread over all replicas by load. None: 1, or 0 when remote_engines are given."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs per vLLM replica (tensor parallel); the built-in engine uses 1."""
    placement: Literal["colocated", "separate"] = "colocated"
    """Where local replicas run. "colocated": on the training GPUs (replica i on GPUs
    i·tp ...), asleep while the trainer trains (vLLM sleep mode; the built-in engine frees
    its KV cache), woken for the weight sync and generation. "separate": on GPUs of their
    own after the training GPUs (replica i on GPUs T + i·tp ..., T = training GPUs)."""
    sleep_level: Literal[1, 2] = 1
    """Colocated vLLM: 1 keeps a copy of the weights in host memory while asleep; 2 drops
    them (every sync sends all weights anyway; saves host memory)."""
    remote_engines: list[str] = []
    """Replicas served elsewhere, as base URLs ("http://10.0.0.2:8000"): `agentrl serve
    CONFIG` or `vllm serve` with the flags in docs/vllm.md. Driven token-in/token-out over
    HTTP; the trainer pushes its weights to them at start and after every step."""
    request_timeout_s: PositiveFloat = 600.0
    """Seconds one generation request to a remote replica may take; past it, or when the
    server cannot be reached, the rollout is invalid and the replica leaves service."""
    weight_transport: Literal["auto", "gloo", "nccl", "ipc", "files"] = "auto"
    """Data plane of weight syncs, through vLLM's weight-transfer API. "auto": CUDA IPC
    for vLLM colocated on the training GPUs, NCCL for vLLM on separate GPUs or servers,
    gloo on CPU and to `agentrl serve`. "files": the older safetensors-bucket path for vLLM
    builds without the weight-transfer API (local replicas only)."""
    weight_sync_host: str = ""
    """The trainer's address as remote replicas reach it (they join its gloo/NCCL
    rendezvous there); "" takes this machine's address on the route to each server."""
    weight_sync_bucket_mb: PositiveInt = 256
    """MiB of tensors per bucket of a weight sync (memory held at once while syncing)."""
    weight_sync_timeout_s: PositiveFloat = 300.0
    """Seconds each step of a weight sync (one bucket, start, finish) may take before the
    sync fails with an error naming the replica."""
    max_staleness: NonNegativeInt = 0
    """Policy versions (training steps) generation may run ahead of training. 0: the
    synchronous loop (collect, then train). k >= 1: later collections are generated while
    the trainer trains, by weights at most k steps older than the ones being trained;
    >= 0."""
    inflight_updates: bool = False
    """With max_staleness >= 1: new weights reach the engine between two decode steps and
    running rollouts continue under them (tokens record their version); otherwise the
    engine takes new weights only between collections."""
    carry_over: bool = True
    """With max_staleness >= 1: the next collection's groups start without waiting for
    the slowest group of the one before, and a collection is handed to the trainer once
    it holds its quota of complete groups (per environment, as the sampler drew them);
    groups still running then carry over and are trained in the next collection, whose
    quota they count towards, unless one of their tokens would then be older than
    max_staleness: such a group is waited for. Nothing is discarded, groups stay whole.
    false: each collection is handed over complete, its slowest group included. Not used
    with filter_uniform_groups or train.deterministic (collections are then complete).
    Resume a checkpoint with the value it was written with."""
    collector: Literal["thread", "process"] = "thread"
    """With max_staleness >= 1, where the rollout side (engine replicas, environments,
    runner) runs. "thread": a thread of the trainer's process. "process": a process of its
    own, so that environment, tool and engine code never holds the trainer's interpreter
    lock nor takes its core; environment ids must then be importable (a module path or a
    registered id, not a class defined only in a running script's memory)."""


class CompactionConfig(_Section):
    strategy: Literal["none", "truncate", "drop_oldest", "summarize", "tool"] = "none"
    """What happens when a turn's context would pass max_context_tokens: "none" (no
    budget: the rollout is one row), "truncate" (the rollout ends there, truncated with
    reason "context_budget"), "drop_oldest" turns, a policy-written "summarize" (asked
    for when the budget is reached), or "tool": the policy is offered a `compact` tool
    whose argument is its own summary and compacts whenever it calls it; the budget still
    forces a compaction (`fallback`) when it has not compacted in time."""
    fallback: Literal["summarize", "drop_oldest", "truncate"] = "summarize"
    """strategy "tool": what the budget forces when the policy has not compacted in time."""
    max_context_tokens: PositiveInt = 2048
    """Context tokens (prompt + history) a turn may start from before compaction; >= 1,
    and max_context_tokens + rollout.max_new_tokens must fit the model's positions."""
    keep_last_turns: NonNegativeInt = 2
    """drop_oldest / summarize / tool: turns kept after the system and task messages (and
    the summary); >= 0. After a budget overflow the newest turn, with its tool result, is
    always kept, even with 0; a `compact` call keeps the last keep_last_turns turns
    before it."""
    max_compactions: NonNegativeInt = 4
    """Compactions per rollout (by tool and by budget together); >= 0; past it the
    rollout ends as truncated (reason "max_compactions")."""
    summary_max_tokens: PositiveInt = 128
    """summarize (and the tool strategy's summarize fallback): generated tokens for the
    summary; >= 1."""

    @property
    def asks_for_summary(self) -> bool:
        """Whether a budget overflow asks the policy for a summary (summarize, or the tool
        strategy with its summarize fallback)."""
        return self.strategy == "summarize" or (
            self.strategy == "tool" and self.fallback == "summarize")

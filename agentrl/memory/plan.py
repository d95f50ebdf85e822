"""The memory plan: what one training rank holds on its GPU, term by term, before launch.

Every term is in BYTES (printed in GiB = 2^30 bytes). The model is the one of
``model.path`` (its config.json, or a known shape when the folder is not here), trained
as the trainer does: FSDP2 over the training ranks, fp32 master parameters, gradients and
AdamW states sharded; compute in ``model.dtype``; decoder layers checkpointed when
``train.activation_checkpointing`` is on ("auto" plans for a GPU, so on); log-probs from
the hidden states in chunks of ``train.logprob_chunk_tokens`` positions.
The bytes per token and the parameter counts it adds up are
:mod:`agentrl.memory.activations`'s.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from agentrl.config import Config
from agentrl.engines.build import engine_max_len, max_request_row
from agentrl.memory.activations import (
    layer_bytes_per_token,
    lora_bytes_per_token,
    num_adapter_values,
    parameter_counts,
    saved_bytes_per_token,
)
from agentrl.model.args import ModelArgs
from agentrl.parallel.fsdp import shards

GIB = 1024**3
MASTER_STATE_BYTES = 16
"""Per parameter: fp32 master weight 4 + fp32 gradient 4 + AdamW exp_avg and exp_avg_sq 8."""
RUNTIME_RESERVE_BYTES = 2 * GIB
"""CUDA context, NCCL buffers and allocator fragmentation: a rule of thumb per GPU."""
VLLM_DEFAULT_UTILIZATION = 0.5
"""vLLM's gpu_memory_utilization when rollout.vllm_args does not set it (build_engine)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
"""Compute dtype sizes; the plan is for GPUs, where "auto" computes in bfloat16."""

Phase = Literal["always", "training", "generation"]


class MemoryTerm(msgspec.Struct):
    """One line of the plan."""

    name: str
    bytes: float
    """Bytes on one GPU."""
    detail: str
    phase: Phase = "always"
    """When the bytes are held: all the time, only while training (activations, gathered
    parameters) or only while generating (a colocated engine asleep during training)."""


class MemoryPlan(msgspec.Struct):
    """Rank 0's memory (trainer and engine) against the GPU's."""

    gpu_bytes: float
    num_ranks: int
    activation_checkpointing: bool
    terms: list[MemoryTerm]
    """Training terms, then the engine's share and the runtime reserve."""
    suggestions: list[str] = []
    """Settings that would make a config that does not fit fit (empty when it fits)."""
    max_fitting_tokens: int = 0
    """The largest micro-batch budget (tokens, multiple of 1024) that fits; 0 if none."""
    generation: str = ""
    """What one rollout generates across its threads, and its longest request."""

    @property
    def total_bytes(self) -> float:
        """Everything rank 0 holds at its peak: what it always holds, plus the larger of
        the training phase and the generation phase."""
        def held(phase: str) -> float:
            return sum(term.bytes for term in self.terms if term.phase == phase)

        return held("always") + max(held("training"), held("generation"))

    @property
    def engine_bytes(self) -> float:
        """The engine's share (rank 0 only)."""
        return sum(term.bytes for term in self.terms if term.name.startswith("engine"))

    @property
    def without_engine_bytes(self) -> float:
        """The peak of a rank whose GPU holds no replica."""
        return sum(t.bytes for t in self.terms if t.phase != "generation"
                   and not t.name.startswith("engine"))

    @property
    def headroom_bytes(self) -> float:
        """GPU memory left at the peak; negative when the config does not fit."""
        return self.gpu_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        """The peak stays within the GPU."""
        return self.headroom_bytes >= 0


# --------------------------------------------------------------------------- the plan


def resolve_activation_checkpointing(setting: str | bool, on_gpu: bool) -> bool:
    """train.activation_checkpointing: "auto" means on when training on a GPU."""
    return on_gpu if setting == "auto" else bool(setting)


def plan_memory(config: Config, args: ModelArgs, gpu_gib: float,
                num_ranks: int | None = None) -> MemoryPlan:
    """Rank 0's peak memory for ``config`` on GPUs of ``gpu_gib`` GiB, with suggestions
    when it does not fit. ``num_ranks``: training ranks (default train.num_ranks)."""
    num_ranks = num_ranks or config.train.num_ranks
    if num_ranks < 1 or not gpu_gib > 0:
        raise ValueError(f"the plan needs >= 1 rank and a positive GPU size; got {num_ranks} "
                         f"ranks and {gpu_gib} GiB")
    plan = _plan(config, args, gpu_gib * GIB, num_ranks)
    plan.generation = rollout_generation(config, args.max_position_embeddings)
    plan.max_fitting_tokens = _max_fitting_tokens(config, args, plan.gpu_bytes, num_ranks)
    if not plan.fits:
        plan.suggestions = _suggestions(config, args, plan)
    return plan


def _plan(config: Config, args: ModelArgs, gpu_bytes: float, num_ranks: int) -> MemoryPlan:
    checkpointing = resolve_activation_checkpointing(config.train.activation_checkpointing,
                                                     on_gpu=True)
    b = DTYPE_BYTES[config.model.dtype]
    tokens = config.batch.max_tokens_per_microbatch
    total, root, layer = parameter_counts(args)
    lora = config.model.lora
    per_token = saved_bytes_per_token(args, b, checkpointing) + lora_bytes_per_token(
        args, lora, b, checkpointing)
    other = saved_bytes_per_token(args, b, not checkpointing) + lora_bytes_per_token(
        args, lora, b, not checkpointing)
    adapters = num_adapter_values(args, lora)
    # one rank computing in fp32 is not wrapped: no gathered copies, no unsharded gradients
    sharded = shards(num_ranks, mixed_precision=config.model.dtype != "float32")
    gathered = MemoryTerm("gathered parameters",
                          b * (root + 2 * layer + 2 * adapters / args.num_hidden_layers),
                          f"{config.model.dtype} copy of the root unit (embeddings, head) "
                          "and two layers (computing + prefetched)", "training")
    terms = [
        *_state_terms(config, total, adapters, b, num_ranks),
        *([gathered] if sharded else []),
        MemoryTerm("activations", tokens * per_token,
                   f"{tokens} tokens × {per_token / 1024:.1f} KiB/token, activation "
                   f"checkpointing {'on' if checkpointing else 'off'} ({other / 1024:.1f} "
                   f"KiB/token {'off' if checkpointing else 'on'})", "training"),
        *(_gradient_terms(config, adapters or total, num_ranks) if sharded else []),
        _backward_working_set(args, b, tokens, checkpointing, config.train.logprob_chunk_tokens,
                              root, layer, num_ranks, tokens * per_token, lora),
        *_engine_shares(config, args, gpu_bytes, b),
        *_snapshot_terms(config, adapters or total, b, "adapter" if adapters else "policy"),
        MemoryTerm("runtime reserve", RUNTIME_RESERVE_BYTES,
                   "CUDA context, NCCL buffers, allocator fragmentation (rule of thumb)"),
    ]
    return MemoryPlan(gpu_bytes=gpu_bytes, num_ranks=num_ranks,
                      activation_checkpointing=checkpointing, terms=terms)


def rollout_generation(config: Config, max_position_embeddings: int) -> str:
    """One rollout's generation in tokens: over its threads (the main thread and up to
    ``max_subagents_per_rollout`` subagents), and the longest request one thread makes."""
    rollout = config.rollout
    total = rollout.max_rollout_tokens + (rollout.max_subagents_per_rollout
                                          * rollout.max_subagent_tokens)
    return (f"a rollout generates at most {total} tokens across its threads (main "
            f"{rollout.max_rollout_tokens} + {rollout.max_subagents_per_rollout} subagents x "
            f"{rollout.max_subagent_tokens}), each thread one request of at most "
            f"{engine_max_len(config, max_position_embeddings)} tokens at a time")


def _state_terms(config: Config, total: int, adapters: int, b: int,
                 num_ranks: int) -> list[MemoryTerm]:
    """Model states: every weight trained (16 B each), or a frozen base plus adapters."""
    ranks = f"/ {num_ranks} rank(s)"
    if config.model.lora is None:
        return [MemoryTerm("model states", MASTER_STATE_BYTES * total / num_ranks,
                           f"{_count(total)} params × 16 B (fp32 master, grad, 2 AdamW "
                           f"moments) {ranks}")]
    rank = config.model.lora.rank
    return [
        MemoryTerm("frozen base", b * total / num_ranks,
                   f"{_count(total)} params × {b} B ({config.model.dtype}); no gradients, "
                   f"no AdamW state {ranks}"),
        MemoryTerm("adapters", MASTER_STATE_BYTES * adapters / num_ranks,
                   f"{_count(adapters)} LoRA params (rank {rank}, "
                   f"{100 * adapters / total:.2f}% of the model) × 16 B (fp32 master, grad, "
                   f"2 AdamW moments) {ranks}")]


def _count(num: int) -> str:
    return f"{num / 1e9:.2f}B" if num >= 1e9 else f"{num / 1e6:.1f}M"


def _gradient_terms(config: Config, total_params: int, num_ranks: int) -> list[MemoryTerm]:
    """train.gradient_sync = "update": until an update's last micro-batch, FSDP2 keeps each
    parameter's gradient unsharded in fp32 on every rank (no reduce-scatter yet), one
    rank included."""
    if config.train.gradient_sync != "update":
        return []
    return [MemoryTerm("accumulated gradients", 4 * total_params,
                       f"{_count(total_params)} params × 4 B: unsharded fp32 gradients "
                       "between an update's micro-batches (train.gradient_sync = \"update\"; "
                       "\"micro_batch\" keeps them sharded)", "training")]


def _backward_working_set(args: ModelArgs, b: int, tokens: int, checkpointing: bool,
                          chunk: int, root_params: int, layer_params: int, num_ranks: int,
                          activations: float, lora: object = None) -> MemoryTerm:
    """The largest transient of backward, of three moments:

    - the LM head's chunk ([chunk, V] logits in compute dtype, their fp32 gradient and its
      compute-dtype copy; the head's weight gradient [V, H] accumulated in fp32 plus one
      chunk's product);
    - one layer (its recomputed activations when checkpointed, and their gradients) while
      the root's gradient waits in compute dtype and the previous layer's fp32
      reduce-scatter buffer is in flight (FSDP2 keeps one);
    - the root unit's reduce-scatter at the very end (embeddings and head: their
      compute-dtype gradient, FSDP2's fp32 copy-in buffer and its 1/N output), when the
      activations are gone (so only what exceeds them is added).

    With ``[model.lora]`` the root is frozen (no head weight gradient, no root gradient,
    no root reduce-scatter), a layer's autograd state gains its adapters' and the
    reduce-scatter buffer holds the previous layer's adapter gradients only.
    """
    vocab, hidden = args.vocab_size, args.hidden_size
    head = chunk * vocab * (2 * b + 4)
    if lora is None:
        head += vocab * hidden * (4 + (b if b != 4 else 0))
    lora_layer = (lora_bytes_per_token(args, lora, b, False)
                  - lora_bytes_per_token(args, lora, b, True)) // args.num_hidden_layers
    full_layer = tokens * (layer_bytes_per_token(args, b, checkpointing=False) + lora_layer)
    if lora is None:
        gradients = b * root_params + 4 * layer_params
    else:
        gradients = 4 * num_adapter_values(args, lora) / args.num_hidden_layers
    layer = full_layer * (2 if checkpointing else 1) + gradients
    root = (b + 4 + 4 / num_ranks) * root_params - activations if lora is None else 0.0
    buffer = "the previous layer's fp32 reduce-scatter buffer"
    candidates = [
        (head, f"log-prob chunk [{chunk} × {vocab}]"
         + (" and the head's fp32 gradient" if lora is None else "")),
        (layer, ("one recomputed layer and its gradients" if checkpointing else
                 "one layer's gradients") + f" at {tokens} tokens, "
         + (f"root gradient, {buffer}" if lora is None else f"{buffer} (adapters)")),
        (root, "the root unit's gradient reduce-scatter at the end of backward (its "
               f"{_count(root_params)} params: compute-dtype gradient + fp32 buffer), "
               "beyond the freed activations"),
    ]
    size, detail = max(candidates, key=lambda c: c[0])
    return MemoryTerm("backward working set", size, detail, "training")


def _snapshot_terms(config: Config, num_params: int, b: int, what: str) -> list[MemoryTerm]:
    """Asynchronous collection on a thread (rollout.max_staleness >= 1): after each step
    the trainer clones the whole policy (a LoRA run: its adapter) in the compute dtype on
    its GPU for the collector; the newest copy waits for the engine while the next is
    being made, so up to two are alive, during training too. (A collector process
    receives CPU tensors, copied one at a time as they are gathered: none of it stays on
    the GPU, ``ProcessCollector.snapshot``.)"""
    if config.rollout.max_staleness == 0 or config.rollout.collector != "thread":
        return []
    return [MemoryTerm("weight snapshots", 2 * b * num_params,
                       f"up to 2 copies of the {what} in the compute dtype for the "
                       f"asynchronous collector ({_count(num_params)} params × {b} B × 2)")]


def _engine_shares(config: Config, args: ModelArgs, gpu_bytes: float,
                   b: int) -> list[MemoryTerm]:
    """The inference replica on rank 0's GPU (``agentrl.engines.build.engine_memory``).
    Colocated vLLM takes its gpu_memory_utilization of the GPU while generating and sleeps
    (frees it) while the trainer trains; the built-in engine keeps its model copy and frees
    its KV cache (slots × max_len × layers × K,V × kv heads × head_dim × dtype bytes).
    Replicas on separate GPUs or remote servers take nothing here."""
    from agentrl.engines.build import engine_memory

    share = engine_memory(config, parameter_counts(args)[0], args.num_hidden_layers,
                          args.num_key_value_heads, args.head_dim,
                          args.max_position_embeddings, itemsize=b)
    if share.num_local_replicas == 0:
        return [MemoryTerm("engine (remote)", 0.0, "replicas are servers elsewhere")]
    if not share.colocated:
        return [MemoryTerm("engine (separate)", 0.0, "replicas run on GPUs of their own")]
    if share.vllm_gpu_memory_fraction is not None:
        util = share.vllm_gpu_memory_fraction
        return [MemoryTerm("engine (vLLM)", util * gpu_bytes,
                           f"gpu_memory_utilization {util:g} of the GPU (rollout.vllm_args); "
                           "asleep while training", "generation")]
    weights, kv = share.weight_bytes_per_replica, share.kv_cache_bytes_per_replica
    slots = config.rollout.max_concurrent_rollouts
    max_len = engine_max_len(config, args.max_position_embeddings)
    what = "the built-in engine's weights"
    adapters = num_adapter_values(args, config.model.lora)
    if adapters:  # LoRA: the frozen base plus up to max_staleness + 1 live adapter versions
        versions = config.rollout.max_staleness + 1
        weights += versions * adapters * b
        what += f" (base) and {versions} adapter version(s)"
    if config.rollout.max_staleness > 0:  # it generates the next collection meanwhile
        kv_term = MemoryTerm("engine KV cache", kv, f"{slots} slots × {max_len} tokens (the "
                             "longest thread's request); in use while training "
                             "(asynchronous collection)")
    else:
        kv_term = MemoryTerm("engine KV cache", kv, f"{slots} slots × {max_len} tokens (the "
                             "longest thread's request); freed while training", "generation")
    return [MemoryTerm("engine model copy", weights, what), kv_term]


def _with(config: Config, section: str, **changes: object) -> Config:
    part = msgspec.structs.replace(getattr(config, section), **changes)
    return msgspec.structs.replace(config, **{section: part})


def _max_fitting_tokens(config: Config, args: ModelArgs, gpu_bytes: float,
                        num_ranks: int) -> int:
    """The largest multiple of 1024 tokens per micro-batch that fits (0 if none)."""
    def fits(tokens: int) -> bool:
        changed = _with(config, "batch", max_tokens_per_microbatch=tokens)
        return _plan(changed, args, gpu_bytes, num_ranks).fits

    low, high = 0, 1024  # in units of 1024 tokens; the plan is monotone in the budget
    while fits(high * 1024) and high < 1 << 20:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * 1024) else (low, mid)
    return low * 1024


def _suggestions(config: Config, args: ModelArgs, plan: MemoryPlan) -> list[str]:
    """Each knob alone, at the value that would make the config fit."""
    out = []
    if not plan.activation_checkpointing:
        on = _with(config, "train", activation_checkpointing=True)
        if _plan(on, args, plan.gpu_bytes, plan.num_ranks).fits:
            out.append("train.activation_checkpointing = true")
    if config.train.gradient_sync == "update":
        per_micro = _with(config, "train", gradient_sync="micro_batch")
        if _plan(per_micro, args, plan.gpu_bytes, plan.num_ranks).fits:
            out.append('train.gradient_sync = "micro_batch" (gradients stay sharded; one '
                       "reduce-scatter per micro-batch)")
    # a harness program's request is a row only the engine's context bounds
    longest_row = (max_request_row if any(e.harness for e in config.environments)
                   else engine_max_len)(config, args.max_position_embeddings)
    if plan.max_fitting_tokens >= longest_row:
        out.append(f"batch.max_tokens_per_microbatch = {plan.max_fitting_tokens}")
    elif plan.max_fitting_tokens:
        out.append(f"batch.max_tokens_per_microbatch = {plan.max_fitting_tokens} would fit "
                   f"but rows reach {longest_row} tokens: shorten them (compaction) too")
    if config.rollout.engine == "vllm":
        spare = plan.headroom_bytes + plan.engine_bytes
        util = int(100 * spare / plan.gpu_bytes) / 100
        if util >= 0.1:
            out.append(f"rollout.vllm_args.gpu_memory_utilization = {util:.2f} (a smaller "
                       "KV cache: fewer concurrent rollouts in vLLM)")
    if config.model.lora is None:
        from agentrl.config import LoRAConfig

        lora = _with(config, "model", lora=LoRAConfig())
        if _plan(lora, args, plan.gpu_bytes, plan.num_ranks).fits:
            out.append("[model.lora] (rank 16 on every projection: the base frozen, "
                       "adapters trained; docs/lora.md)")
    for ranks in (2, 4, 8, 16, 32, 64):
        if ranks > plan.num_ranks and _plan(config, args, plan.gpu_bytes, ranks).fits:
            out.append(f"{ranks} training ranks (--ranks {ranks}; FSDP2 shards the states)")
            break
    return out


def describe_memory_plan(plan: MemoryPlan) -> str:
    """The plan as printed by ``agentrl plan --gpu-memory``: one term per line, in GiB."""
    lines = [f"memory per GPU (rank 0: trainer + engine; {plan.num_ranks} training rank(s), "
             f"{plan.gpu_bytes / GIB:g} GiB):"]
    for term in plan.terms:
        when = "" if term.phase == "always" else f"[{term.phase}] "
        lines.append(f"  {term.name:<22} {term.bytes / GIB:7.2f} GiB  {when}{term.detail}")
    held = {phase: sum(t.bytes for t in plan.terms if t.phase == phase) / GIB
            for phase in ("always", "training", "generation")}
    lines.append(f"  {'total':<22} {plan.total_bytes / GIB:7.2f} GiB  always "
                 f"{held['always']:.2f} + max(training {held['training']:.2f}, generation "
                 f"{held['generation']:.2f})")
    lines.append(f"  {'headroom':<22} {plan.headroom_bytes / GIB:7.2f} GiB")
    if plan.generation:
        lines.append(f"generation: {plan.generation}")
    if plan.num_ranks > 1 and plan.engine_bytes:
        others = "rank 1" if plan.num_ranks == 2 else f"ranks 1-{plan.num_ranks - 1}"
        lines.append(f"{others} (no engine): {plan.without_engine_bytes / GIB:.2f} GiB each")
    tokens = f"largest micro-batch that fits: {plan.max_fitting_tokens} tokens"
    if plan.fits:
        lines.append(f"fits; {tokens}")
        return "\n".join(lines)
    lines.append(f"WARNING: does not fit by {-plan.headroom_bytes / GIB:.2f} GiB. Any one of "
                 "these would fit:" if plan.suggestions else
                 f"WARNING: does not fit by {-plan.headroom_bytes / GIB:.2f} GiB, and no "
                 "single setting fixes it: use larger GPUs or more ranks.")
    lines.extend(f"  {s}" for s in plan.suggestions)
    return "\n".join(lines)

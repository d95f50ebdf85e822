"""Measuring training memory: the autograd state of one micro-batch, its peak RSS on the
CPU, its peak CUDA memory on a GPU.

"Autograd state" is every tensor saved for backward (``saved_tensors_hooks``), counted
once per storage, parameters excluded (they are model state), split into what each
decoder layer keeps alone, what several layers share (the rope tables) and the rest
(embedding ids, final norm, LM head, log-probs and loss). ``agentrl.memory.plan``
predicts the same figures from the model's shape; ``bench/memory.py`` compares the
training path of before issue #10 with today's; ``measure_step_peak`` checks the plan on
a GPU against an FSDP2-sharded update (``build_sharded``).
"""

from __future__ import annotations

import contextlib
import ctypes
import random
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import msgspec
import torch
from torch import nn

from agentrl.config import Config, LossConfig
from agentrl.loss import entropy, policy_loss, token_logprobs
from agentrl.model import CausalLM, ModelArgs
from agentrl.model.layers import DecoderLayer
from agentrl.packing import MicroBatch, collate
from agentrl.parallel.caches import trim_host_heap
from agentrl.types import Row

KIB, GIB = 1024, 1024**3


class SavedPerToken(msgspec.Struct):
    """Bytes of autograd state per token of a micro-batch, by part of the model."""

    per_layer: float
    """Mean over the decoder layers of what each keeps alone."""
    shared: float
    """Tensors kept by more than one layer (the rope tables), counted once."""
    head: float
    """Embedding, final norm, LM head, log-probs and loss."""

    def total(self, num_layers: int) -> float:
        """Bytes per token of a model ``num_layers`` deep."""
        return self.per_layer * num_layers + self.shared + self.head


# --------------------------------------------------------------------------- inputs


def build_model(args: ModelArgs, dtype: torch.dtype, device: str = "cpu") -> CausalLM:
    """A randomly initialised model of this shape (values do not matter for memory)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = CausalLM(args, attention="auto" if device != "cpu" else "torch")
    finally:
        torch.set_default_dtype(previous)
    return model


def synthetic_micro_batch(vocab: int, num_tokens: int, num_rows: int, seed: int = 0
                          ) -> MicroBatch:
    """``num_tokens`` tokens in ``num_rows`` packed rows: a quarter prompt, the rest generated."""
    rng = random.Random(seed)
    lengths = [num_tokens // num_rows] * num_rows
    lengths[-1] += num_tokens - sum(lengths)
    rows = []
    for i, length in enumerate(lengths):
        prompt = max(1, length // 4)
        mask = [0] * prompt + [1] * (length - prompt)
        rows.append(Row(f"r{i}", f"g{i}", "e", 0, [rng.randrange(vocab) for _ in mask], mask,
                        [-1.0 * m for m in mask], reward=1.0))
    return collate(rows, [0.5 if i % 2 else -0.5 for i in range(num_rows)], range(num_rows))


def training_loss(model: nn.Module, mb: MicroBatch, chunked_head: bool) -> torch.Tensor:
    """One micro-batch's loss, through the training path of today (chunked head) or of
    before (full logits, reduced by ``token_logprobs``); entropy computed as each did."""
    if chunked_head:
        logprobs, _ = model(mb.input_ids, mb.position_ids, mb.cu_seqlens,
                            targets=mb.target_ids, temperature=1.0)
    else:
        logits = model(mb.input_ids, mb.position_ids, mb.cu_seqlens)
        logprobs = token_logprobs(logits, mb.target_ids)
        entropy(logits)
    loss, _ = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask,
                          max(mb.num_tokens, 1), LossConfig(), engine_logprobs=mb.engine_logprobs)
    return loss


# --------------------------------------------------------------------------- measuring


def saved_bytes(model: CausalLM, mb: MicroBatch, chunked_head: bool,
                backward: bool = False) -> SavedPerToken:
    """Bytes per token saved for backward by the training forward (and the loss); with
    ``backward`` the loss is then backpropagated (to measure the peak around it)."""
    owners: dict[int, set[str]] = defaultdict(set)
    sizes: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    section = ["head"]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in params:
            owners[key].add(section[-1])
            sizes[key] = t.untyped_storage().nbytes()
        # an alias without autograd history: handing back ``t`` itself would tie a saved
        # output to its own grad_fn in a cycle that keeps the whole graph alive
        return t.detach()

    with _layer_sections(model, section), torch.autograd.graph.saved_tensors_hooks(
        pack, lambda t: t
    ):
        loss = training_loss(model, mb, chunked_head)
    if backward:
        loss.backward()
    del loss
    by_part: dict[str, int] = defaultdict(int)
    for key, names in owners.items():
        part = "shared" if len(names) > 1 else next(iter(names))
        by_part["layer" if part.startswith("layer") else part] += sizes[key]
    num_tokens, num_layers = mb.input_ids.numel(), max(len(model.model.layers), 1)
    return SavedPerToken(per_layer=by_part["layer"] / num_layers / num_tokens,
                         shared=by_part["shared"] / num_tokens, head=by_part["head"] / num_tokens)


@contextlib.contextmanager
def _layer_sections(model: CausalLM, section: list[str]) -> Iterator[None]:
    """While a decoder layer runs, ``section[-1]`` names it."""
    def leave(*_: Any) -> None:
        section.pop()

    handles = []
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer, DecoderLayer)

        def enter(*_: Any, name: str = f"layer{i}") -> None:
            section.append(name)

        handles.append(layer.register_forward_pre_hook(enter))
        handles.append(layer.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def saved_bytes_and_peak_rss(model: CausalLM, mb: MicroBatch, chunked_head: bool,
                             grads_allocated: bool) -> tuple[SavedPerToken, int]:
    """Saved bytes per token, and the resident-set high-water mark of forward + backward
    above the RSS before it (freed memory handed back to the system first). With
    ``grads_allocated`` the parameter gradients exist beforehand (the peak then holds the
    activations and transients only), else backward creates them (the peak includes them)."""
    model.zero_grad(set_to_none=True)
    if grads_allocated:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    _return_freed_memory()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    saved = saved_bytes(model, mb, chunked_head, backward=True)
    peak = (_status_kib("VmHWM") - before) * KIB
    model.zero_grad(set_to_none=True)
    return saved, peak


def _return_freed_memory() -> None:
    """Make glibc serve allocations of 64 KiB and up by mmap (returned when freed) and
    trim its heap, so RSS follows the live tensors instead of the allocator's cache."""
    ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (no dynamic raise)
    trim_host_heap()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


# --------------------------------------------------------------------------- on a GPU


def build_sharded(args: ModelArgs, compute: torch.dtype, device: torch.device,
                  attention: str = "auto") -> CausalLM:
    """A randomly initialised model of this shape laid out as the trainer's policy: fp32
    master weights, FSDP2-sharded over every rank of the default group (collective; one
    rank in fp32, or one CPU rank in mixed precision, keeps it unwrapped, as
    ``parallel.fsdp.shards`` says), computing in ``compute``. Built on the meta device,
    so no rank holds it whole."""
    from agentrl.model.checkpoint import fresh_inv_freq
    from agentrl.parallel.fsdp import lay_out

    with torch.device("meta"):
        model = CausalLM(args, attention=attention)
    model = model.to(torch.float32)
    lay_out(model, compute, compute != torch.float32, device)  # as load_sharded does
    model.to_empty(device=device)
    if args.tie_word_embeddings:  # to_empty gives the head a tensor of its own: re-tie
        model.lm_head.weight = model.model.embed_tokens.weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    model.inv_freq = fresh_inv_freq(args).to(device)
    return model


def measure_step_peak(config: Config, model: nn.Module, num_ranks: int,
                      num_micro_batches: int | None = None,
                      terms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One training update of ``model`` (as built for training, e.g. :func:`build_sharded`
    and configured) at the config's micro-batch budget, rows as long as the engine's
    context, its peak memory against the memory plan for ``num_ranks`` ranks.

    A small warm-up update allocates the gradients (their shards); then one update of
    ``num_micro_batches`` micro-batches (default: 2 when the plan accumulates unsharded
    gradients between micro-batches, else 1) is measured: on a GPU
    ``torch.cuda.max_memory_allocated`` above what was allocated before it, against the
    plan's terms held only while training (``terms`` narrows them): gathered parameters,
    activations, accumulated gradients and the backward working set, whose largest moment
    on a sharded model can be the root unit's fp32 reduce-scatter. On the CPU the same
    update runs and ``measured_gib`` is None. Collective on a sharded model (every rank
    calls it)."""
    from agentrl.engines.build import engine_max_len
    from agentrl.memory.plan import plan_memory
    from agentrl.model.shapes import model_shape
    from agentrl.train.update import forward_backward

    args = model_shape(config.model.path)
    on_gpu = next(model.parameters()).device.type == "cuda"
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if on_gpu else 80.0
    plan = plan_memory(config, args, gpu_gib, num_ranks)
    held = [t for t in plan.terms if t.phase == "training" and (terms is None or t.name in terms)]
    if num_micro_batches is None:
        num_micro_batches = 2 if any(t.name == "accumulated gradients" for t in held) else 1
    tokens = config.batch.max_tokens_per_microbatch
    row = min(engine_max_len(config, args.max_position_embeddings), tokens)
    temperature, sync = config.rollout.temperature, config.train.gradient_sync
    warm_up = synthetic_micro_batch(args.vocab_size, min(row, 256), 1)
    forward_backward(model, [warm_up], config.loss, temperature=temperature,
                     gradient_sync=sync)
    mbs = [synthetic_micro_batch(args.vocab_size, tokens, -(-tokens // row), seed=i)
           for i in range(num_micro_batches)]
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if on_gpu else 0
    forward_backward(model, mbs, config.loss, temperature=temperature, gradient_sync=sync)
    planned = sum(t.bytes for t in held)
    figures: dict[str, Any] = {
        "tokens": float(tokens), "num_micro_batches": num_micro_batches,
        "planned_gib": planned / GIB, "plan_total_gib": plan.total_bytes / GIB,
        "terms": {t.name: t.bytes / GIB for t in held}, "measured_gib": None, "ratio": None}
    if on_gpu:
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before
        figures.update(measured_gib=measured / GIB, ratio=measured / planned,
                       peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB)
    return figures

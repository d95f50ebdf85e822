"""Measuring training memory: the autograd state of one micro-batch, its peak RSS on the
CPU, its peak CUDA memory on a GPU.

"Autograd state" is every tensor saved for backward (``saved_tensors_hooks``), counted
once per storage, parameters excluded (they are model state), split into what each
decoder layer keeps alone, what several layers share (the rope tables) and the rest
(embedding ids, final norm, LM head, log-probs and loss). ``agentrl.memory.plan``
predicts the same figures from the model's shape; ``bench/memory.py`` compares the
training path of before issue #10 with today's; ``measure_cuda_peak`` checks the plan on
a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch import nn

from agentrl.config import Config, LossConfig
from agentrl.loss import entropy, policy_loss, token_logprobs
from agentrl.model import CausalLM, ModelArgs
from agentrl.model.model import DecoderLayer
from agentrl.packing import MicroBatch, collate
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
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (fixed: no dynamic raise)
    libc.malloc_trim(0)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


# --------------------------------------------------------------------------- on a GPU


def measure_cuda_peak(config: Config, model: nn.Module | None = None,
                      num_ranks: int | None = None) -> dict[str, float]:
    """Peak CUDA memory of one training micro-batch at the config's budget, against the
    memory plan (for bench/gpu_acceptance.py).

    ``model``: the trainer's model as built for training (e.g. FSDP2-wrapped); None builds
    ``model.path`` on the current GPU (random weights of its known shape when the folder is
    absent). Memory is configured as the trainer does, one small warm-up update allocates
    the gradients, then one update over ``batch.max_tokens_per_microbatch`` tokens (rows
    as long as the engine's context) is measured: ``torch.cuda.max_memory_allocated``
    above what was allocated before it, against the plan's activations + backward working
    set. Returns GiB figures and their ratio measured / planned (want <= 1).
    """
    from agentrl.engines.build import engine_max_len
    from agentrl.memory.plan import plan_memory, resolve_activation_checkpointing
    from agentrl.model import load_pretrained
    from agentrl.model.shapes import model_shape
    from agentrl.parallel.fsdp import compute_dtype
    from agentrl.train.update import forward_backward

    args = model_shape(config.model.path)
    dtype = compute_dtype(config.model.dtype, torch.device("cuda"))  # "auto" too
    if model is None:
        if (Path(config.model.path) / "config.json").is_file():
            model = load_pretrained(config.model.path, dtype=dtype,
                                    attention=config.model.attention, device="cuda")
        else:
            model = build_model(args, dtype, device="cuda")
        model.configure_memory(
            resolve_activation_checkpointing(config.train.activation_checkpointing, True),
            config.train.logprob_chunk_tokens)
    tokens = config.batch.max_tokens_per_microbatch
    row = min(engine_max_len(config, args.max_position_embeddings), tokens)
    temperature = config.rollout.temperature
    warm_up = synthetic_micro_batch(args.vocab_size, min(row, 256), 1)
    forward_backward(model, [warm_up], config.loss, temperature=temperature)
    mb = synthetic_micro_batch(args.vocab_size, tokens, -(-tokens // row))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    forward_backward(model, [mb], config.loss, temperature=temperature)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    plan = plan_memory(config, args, gpu_gib, num_ranks)
    planned = sum(t.bytes for t in plan.terms
                  if t.name in ("activations", "backward working set"))
    return {"tokens": float(tokens), "measured_gib": measured / GIB,
            "planned_gib": planned / GIB, "ratio": measured / planned,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "plan_total_gib": plan.total_bytes / GIB}

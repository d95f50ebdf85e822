"""Autograd state per token and peak memory of one training micro-batch, before vs after.

before: the model returns fp32 logits [T, V] for every position and the loss reduces them
        (the training path until issue #10), no activation checkpointing;
after:  the model's forward returns the targets' log-probs computed from the hidden
        states in chunks (``train.logprob_chunk_tokens``), every decoder layer checkpointed.

"Autograd state" is every tensor saved for backward (``saved_tensors_hooks``), counted
once per storage, parameters excluded (they are model state). It splits into

- per layer: what one decoder layer keeps, per token (measured on a model with
  ``--layers`` layers and a small vocabulary: a layer does not depend on the vocabulary);
- shared: tensors every layer keeps (the rope tables), once per micro-batch;
- head and loss: embedding ids, final norm, LM head, log-probs and the loss, measured on
  a model with the real vocabulary and no decoder layer,

and extrapolates to the full depth: per layer × layers + shared + head. Peak RSS is the
process's resident-set high-water mark during forward + backward (reset through
/proc/self/clear_refs) above what it held before, with every parameter gradient already
allocated: activations and transient tensors only.

Shapes: Qwen2.5-1.5B and Qwen2.5-7B (the real vocabularies), in bf16 and fp32. The 7B
head model ties its head to the embedding to halve its weights: tying changes no
activation. Memory: the largest run (7B head model, fp32: 2.2 GB weights + 2.2 GB
gradients + the before path's [T, V] fp32 logits and their gradient at T = 512) peaks
near 6.5 GB of RSS; everything else stays under 4 GB. Takes a few minutes on 2 cores.

    python -m bench.memory [--shapes qwen2.5-1.5b qwen2.5-7b] [--dtypes bfloat16 float32]
                           [--tokens 1024] [--head-tokens 512] [--layers 2]

``measure_cuda_peak(config)`` is the GPU check: peak CUDA memory of one micro-batch at the
config's budget against ``agentrl.memory_plan``.
"""

from __future__ import annotations

import argparse
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
from agentrl.model.shapes import KNOWN_SHAPES
from agentrl.packing import MicroBatch, collate
from agentrl.types import Row

SHAPES = {"qwen2.5-1.5b": "Qwen2.5-1.5B", "qwen2.5-7b": "Qwen2.5-7B"}
KIB, MIB, GIB = 1024, 1024**2, 1024**3
LAYER_VOCAB = 1024
"""Vocabulary of the model the per-layer figures are measured on."""


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
        return t

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


# --------------------------------------------------------------------------- one shape


class Measurement(msgspec.Struct):
    """One variant (before or after) of one shape and dtype."""

    saved: SavedPerToken
    layers_peak: int
    """Peak RSS bytes of forward + backward of the layer model above its weights and
    gradients: activations and transients."""
    head_peak: int
    """The same for the head model, its [V, H] weight gradient included (too big for this
    machine to hold twice at 7B in fp32)."""


def measure(args: ModelArgs, dtype: torch.dtype, after: bool, num_tokens: int = 512,
            num_rows: int = 4, num_layers: int = 2) -> Measurement:
    """Saved bytes per token and peak RSS of the before or after training path, from a
    ``num_layers``-deep model with a small vocabulary (the layers) and a model with no
    layer and the real vocabulary, its head tied to the embedding (head and loss; the
    embedding's own backward, a dense [V, H] gradient at the very end, is left out)."""
    layer_args = msgspec.structs.replace(args, num_hidden_layers=num_layers,
                                         vocab_size=LAYER_VOCAB, tie_word_embeddings=True)
    head_args = msgspec.structs.replace(args, num_hidden_layers=0, tie_word_embeddings=True)
    parts = []
    for part_args in (layer_args, head_args):
        model = build_model(part_args, dtype)
        model.configure_memory(activation_checkpointing=after)
        if part_args is head_args:
            model.model.embed_tokens.register_forward_hook(
                lambda _m, _i, out: out.detach().requires_grad_())
        for tokens in (64, num_tokens):  # a small warm-up run first: one-time allocations
            mb = synthetic_micro_batch(part_args.vocab_size, tokens, num_rows)
            saved, peak = saved_bytes_and_peak_rss(model, mb, after,
                                                   grads_allocated=part_args is layer_args)
        parts.append((saved, peak))
        del model
    (layers, layers_peak), (head, head_peak) = parts
    saved = SavedPerToken(per_layer=layers.per_layer, shared=layers.shared, head=head.head)
    return Measurement(saved=saved, layers_peak=layers_peak, head_peak=head_peak)


def report_shape(name: str, args: ModelArgs, dtype: torch.dtype, num_tokens: int,
                 num_layers: int) -> list[str]:
    """Before vs after for one shape and dtype, as printed lines."""
    from agentrl.memory_plan import saved_bytes_per_token

    before = measure(args, dtype, after=False, num_tokens=num_tokens, num_layers=num_layers)
    after = measure(args, dtype, after=True, num_tokens=num_tokens, num_layers=num_layers)
    depth = args.num_hidden_layers
    b = torch.finfo(dtype).bits // 8
    lines = [f"{name} {str(dtype).removeprefix('torch.')} ({num_tokens} tokens, "
             f"{num_layers} layers + head model; {depth} layers extrapolated)"]

    def row(what: str, old: float, new: float, unit: float, unit_name: str) -> str:
        ratio = f"{old / new:8.1f}x" if new else "       -"
        return (f"  {what:<34} {old / unit:10.2f} {unit_name} -> {new / unit:9.3f} "
                f"{unit_name}  {ratio}")

    lines += [
        row("per layer per token", before.saved.per_layer, after.saved.per_layer, KIB, "KiB"),
        row("shared (rope) per token", before.saved.shared, after.saved.shared, KIB, "KiB"),
        row("head and loss per token", before.saved.head, after.saved.head, KIB, "KiB"),
        row(f"all {depth} layers + head per token", before.saved.total(depth),
            after.saved.total(depth), MIB, "MiB"),
        row(f"peak RSS, {num_layers} layers (activations)", before.layers_peak,
            after.layers_peak, MIB, "MiB"),
        row("peak RSS, head (+ its [V, H] grad)", before.head_peak, after.head_peak, MIB,
            "MiB"),
    ]
    plan_old = saved_bytes_per_token(args, b, checkpointing=False, full_logits=True)
    plan_new = saved_bytes_per_token(args, b, checkpointing=True)
    agreement = (before.saved.total(depth) / plan_old, after.saved.total(depth) / plan_new)
    lines.append(f"  memory plan's estimate per token: {plan_old / MIB:.3f} MiB -> "
                 f"{plan_new / MIB:.4f} MiB (measured / plan: {agreement[0]:.3f}, "
                 f"{agreement[1]:.3f})")
    return lines


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
    from agentrl.memory_plan import engine_max_len, plan_memory, resolve_activation_checkpointing
    from agentrl.model import load_pretrained
    from agentrl.model.shapes import model_shape
    from agentrl.update import forward_backward

    args = model_shape(config.model.path)
    dtype = getattr(torch, config.model.dtype)
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


def main() -> None:
    """Measure every requested shape and dtype, print before/after and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float32"])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per micro-batch")
    parser.add_argument("--layers", type=int, default=2, help="layers of the layer model")
    opts = parser.parse_args()
    torch.manual_seed(0)
    print("autograd state saved for backward per token, before (full fp32 logits, no "
          "checkpointing) -> after (chunked log-probs, checkpointed layers); ratio before/after")
    for key in opts.shapes:
        for dtype_name in opts.dtypes:
            dtype = getattr(torch, dtype_name)
            lines = report_shape(SHAPES[key], KNOWN_SHAPES[SHAPES[key]], dtype, opts.tokens,
                                 opts.layers)
            print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

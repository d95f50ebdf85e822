"""Optional ``torch.compile`` of the decoder (``model.compile``), off by default.

What is compiled: each decoder layer's per-token work, in two regions around attention
(``layer_project``: input norm, q/k/v, q/k norm, rope; ``layer_finish``: o_proj, the
residual, the MLP block). Attention stays eager: the CPU's exact per-row path loops over
the pack's row lengths as host ints, and the GPU kernels take ``max_seqlen`` as one, so a
compiled attention would be specialised to each pack's rows and recompile at every step.
Around it every size is the token count (and, in the last layer, the generated-token
count), which ``dynamic=True`` keeps symbolic: one compilation serves every pack.

The regions are plain functions taking the layer as an argument, compiled once for the
whole process: with torch's inlining of built-in modules (on by default) the parameters
are graph inputs, so every layer of every model shares one graph (no recompilation per
layer), FSDP2's hooks stay outside the compiled code (around each layer's call, where
they gather and free its shards) and activation checkpointing recomputes the same
compiled regions in backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def compiled(fn: F) -> F:
    """``fn`` through ``torch.compile(dynamic=True)``, built once per function (lazily: the
    import of torch's compiler costs seconds and an eager run never pays it)."""
    return torch.compile(fn, dynamic=True)  # type: ignore[return-value]


def compile_model(model: nn.Module, enabled: bool = True) -> None:
    """Turn ``model.compile`` on (or off) for every decoder layer of a ``CausalLM``, in
    place, before or after FSDP2 sharding. The first forward and backward of each new
    kind of call (training pack, last layer with kept positions, prefill, decode) pay
    the compilation; later ones reuse it."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"model.compile needs agentrl's CausalLM (model.model.layers); "
                         f"got {type(model).__name__}")
    for layer in layers:
        layer.compiled = enabled

"""Float32 linear weights packed once into MKL's GEMM layout, for inference on a CPU.

A plain ``F.linear`` on a CPU repacks its weight into the GEMM kernel's blocked layout at
every call. The built-in engine multiplies the same weights by the same few to few hundred
rows at every decode step, so it packs each weight once per weight version
(:func:`prepack_linears`) and its forwards then skip that work: on 2 cores the projections
of 8 layers at hidden 512 ran 1.17× faster at 128 rows, 1.1 to 1.4× at 4 to 64, and the
engine's 128 samples of 40 tokens 1.07× (``python -m bench.prepacked_linear``). The
product is MKL's own GEMM on the same operands, equal to ``F.linear`` to float rounding
(mostly to the bit).

A packed weight is used only where it is current and nothing records a gradient: it
remembers its weight's storage and in-place version counter, so a weight that was trained,
synced into (``copy_``, ``load_state_dict``) or replaced since packing falls back to
``F.linear`` without any caller having to remember to drop it. (A write through
``weight.data`` bypasses the version counter; agentrl never writes weights that way.) Under
``torch.compile`` the plain product runs (the compiler handles weights its own way).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 4
"""Fewer rows than this take ``F.linear``, which was faster there (the packed GEMM ran
0.93× at one row, a matrix-vector product, and 0.89× at two)."""

PACK_ROWS = 128
"""The row count MKL is told to pack for (a layout hint; any row count may use it)."""


class PrepackedWeight(NamedTuple):
    """A weight in MKL's packed layout and what identifies the weight it was made from."""

    packed: torch.Tensor
    data_ptr: int
    version: int


def can_prepack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can be packed: float32 on a CPU, with torch built with MKL."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"))


def is_current(entry: PrepackedWeight | None, weight: torch.Tensor) -> bool:
    """Whether ``entry`` was packed from ``weight`` as it is now (same storage, no in-place
    change since)."""
    return (entry is not None and entry.data_ptr == weight.data_ptr()
            and entry.version == weight._version)


class Linear(nn.Linear):
    """``nn.Linear`` that multiplies by its packed weight when one is current (see the
    module docstring); the same parameters, names and state dict."""

    prepacked: PrepackedWeight | None = None

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight behind: MKL's opaque buffer has no
        storage to copy, and a copy packs its own when an engine runs it."""
        state = super().__getstate__()
        state.pop("prepacked", None)
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """``F.linear(x, weight, bias)``, through the packed weight where it applies."""
        return linear(self, x, self.bias)


def linear(module: Linear, x: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear(x, module.weight, bias)``; through ``module.prepacked`` when it is
    current, no gradient is being recorded, ``x`` is float32 and has at least
    :data:`MIN_ROWS` rows."""
    weight = module.weight
    if torch.compiler.is_compiling() or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    entry = module.prepacked
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows < MIN_ROWS or x.dtype != torch.float32 or not is_current(entry, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, entry.packed, weight, bias, rows)


def prepack_linears(model: nn.Module) -> int:
    """Pack the weight of every :class:`Linear` in ``model`` (the LM head is one) that can be
    packed and whose packed copy is missing or stale; returns how many were packed now.
    Call it after the weights change (a stale copy is never used, only wasted)."""
    packed = 0
    with torch.no_grad():
        for module in prepackable(model):
            weight = module.weight
            if is_current(module.prepacked, weight):
                continue
            module.prepacked = None  # free the stale copy before making the new one
            module.prepacked = PrepackedWeight(
                torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_ROWS),
                weight.data_ptr(), weight._version)
            packed += 1
    return packed


def drop_prepacked(model: nn.Module) -> None:
    """Drop every packed copy in ``model`` (their memory goes back)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.prepacked = None


def prepackable(model: nn.Module) -> list[Linear]:
    """The :class:`Linear` modules of ``model`` whose weight can be packed."""
    return [m for m in model.modules() if isinstance(m, Linear) and can_prepack(m.weight)]

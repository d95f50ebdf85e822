"""Mixed precision on one CPU rank without FSDP2: fp32 parameters, each module computing
with a copy of its own parameters cast to the compute dtype for the length of its forward.

This is the arithmetic of FSDP2's ``MixedPrecisionPolicy(param_dtype=compute)`` (every
parameter cast to the compute dtype where it is used, gradients flowing back through the
cast into fp32 ``.grad``), without its machinery: one rank has nobody to gather from or
reduce to, yet FSDP2 still copies every layer's parameters in and every gradient out and
keeps the optimizer on DTensors, which on a CPU costs more than bf16 saves on small models
(``docs/peers.md``). Activation checkpointing recomputes the cast with the layer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn


def compute_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Make ``model`` (fp32 parameters, unwrapped) compute in ``dtype``: every module whose
    own parameters are in another dtype uses a cast copy of them inside its forward. The
    parameters themselves, their gradients and the optimizer stay as they are. Returns the
    model; its ``compute_dtype`` says the dtype."""
    for module in model.modules():
        names = [name for name, param in module.named_parameters(recurse=False)
                 if param.dtype != dtype]
        if names:
            module.register_forward_pre_hook(partial(_cast_in, names=names, dtype=dtype))
            module.register_forward_hook(partial(_cast_out, names=names), always_call=True)
    model.compute_dtype = dtype
    return model


def _cast_in(module: nn.Module, _args: Any, names: list[str], dtype: torch.dtype) -> None:
    # an instance attribute shadows the registered parameter for plain attribute reads
    # (nn.Module looks in _parameters only when normal lookup fails), so the module's
    # forward sees the cast tensor while named_parameters, state_dict and the optimizer
    # keep the fp32 parameter
    for name in names:
        object.__setattr__(module, name, module._parameters[name].to(dtype))


def _cast_out(module: nn.Module, _args: Any, _output: Any, names: list[str]) -> None:
    for name in names:
        module.__dict__.pop(name, None)


def bf16_hint(configured: str, compute: torch.dtype, device: torch.device) -> str | None:
    """A line for the run's start when ``model.dtype = "auto"`` chose float32 on a CPU
    that multiplies bf16 matrices in hardware (AMX tiles), where bf16 trains larger
    models much faster; None otherwise. "auto" stays float32 on every CPU: the same
    arithmetic whatever CPU a run lands on."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    if configured != "auto" or compute != torch.float32 or device.type != "cpu" or not amx():
        return None
    return ("dtype hint: this CPU multiplies bf16 matrices in hardware (AMX); with "
            "model.dtype = \"bfloat16\" an 8-layer, 512-hidden model trained 1.5x faster "
            "than in float32 on 2 such cores (docs/peers.md)")

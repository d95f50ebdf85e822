"""Varlen causal attention: flash-attn's kernel on a GPU, an exact PyTorch path elsewhere.

This is the only module that touches flash-attn. Rows are concatenated along the token
dimension and delimited by ``cu_seqlens`` (cumulative row lengths, starting at 0); no
token attends across a row boundary.

The PyTorch path runs one ``scaled_dot_product_attention(is_causal=True)`` per row. On
CPU that is far faster than one SDPA over the whole pack with a block-diagonal mask (the
mask path does T^2 work for every row; see bench/attention.py) and its backward is exact.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
import torch.nn.functional as F

HAS_FLASH_ATTN: bool = (
    importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()
)
"""flash-attn is importable and a CUDA device is present."""

Backend = Literal["flash", "torch"]


def resolve_backend(choice: str) -> Backend:
    """Turn ModelConfig.attention ("auto" | "flash" | "torch") into the backend to use."""
    if choice == "torch":
        return "torch"
    if choice == "flash":
        if not HAS_FLASH_ATTN:
            raise ValueError(
                'model.attention = "flash" but flash-attn is not importable or no CUDA '
                "device is present; run `pip install agentrl[gpu]` on a GPU machine, or set "
                'model.attention = "auto" to fall back to PyTorch attention.'
            )
        return "flash"
    if choice == "auto":
        return "flash" if HAS_FLASH_ATTN else "torch"
    raise ValueError(f'model.attention = {choice!r}; expected "auto", "flash" or "torch"')


def choose_backend(choice: str, compute_dtype: torch.dtype, device: torch.device,
                   flash_available: bool = HAS_FLASH_ATTN) -> tuple[Backend, str]:
    """The attention backend a run will use and a one-line reason (printed at start-up).

    flash-attn whenever it is installed, the device is a GPU and the compute dtype is
    bf16/fp16 (its kernel takes nothing else); otherwise the exact PyTorch path, and the
    reason says which condition failed. An explicit "flash" that cannot run is an error.
    """
    low_precision = compute_dtype in (torch.float16, torch.bfloat16)
    if choice == "torch":
        return "torch", "PyTorch SDPA per row (model.attention = \"torch\")"
    if choice not in ("auto", "flash"):
        raise ValueError(f'model.attention = {choice!r}; expected "auto", "flash" or "torch"')
    why_not = None
    if not flash_available:
        why_not = "flash-attn is not installed (pip install agentrl[gpu])"
    elif device.type != "cuda":
        why_not = f"the model runs on {device.type}, flash-attn needs a GPU"
    elif not low_precision:
        why_not = (f"the compute dtype is {str(compute_dtype).removeprefix('torch.')}; "
                   'flash-attn needs bfloat16 (model.dtype = "bfloat16" or "auto")')
    if why_not is None:
        return "flash", f"flash-attn varlen ({str(compute_dtype).removeprefix('torch.')})"
    if choice == "flash":
        raise ValueError(f'model.attention = "flash" cannot run: {why_not}; fix that or set '
                         'model.attention = "auto"')
    return "torch", f"PyTorch SDPA per row, because {why_not}"


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Causal attention within each row of a pack.

    q: [total, H, D]; k, v: [total, KVH, D] with H a multiple of KVH (GQA);
    cu_seqlens: int [num_rows + 1]. Returns [total, H, D]. The flash path needs a CUDA
    tensor in fp16/bf16; other inputs take the PyTorch path, which gives the same result.
    ``backend`` None means flash-attn when available (HAS_FLASH_ATTN), else PyTorch.
    """
    backend = backend or resolve_backend("auto")
    if backend == "flash" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return _flash(q, k, v, cu_seqlens, max_seqlen)
    return _torch_per_row(q, k, v, cu_seqlens)


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func  # lazy: optional GPU dependency

    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)


def _torch_per_row(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        # [L, H, D] -> [1, H, L, D] for SDPA
        row = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        out = causal_attention(*row)
        outs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA over dense rows: q [B, H, T, D], k/v [B, KVH, T, D] -> [B, H, T, D]."""
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
    )


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA with a boolean mask (True = may attend): q [N, H, T, D], k/v [N, KVH, S, D]."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1]
    )

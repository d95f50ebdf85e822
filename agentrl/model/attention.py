"""Varlen causal attention: torch's varlen kernel on a GPU, an exact PyTorch path elsewhere.

Rows are concatenated along the token dimension and delimited by ``cu_seqlens``
(cumulative row lengths, starting at 0); no token attends across a row boundary. Three
backends sit behind :func:`varlen_attention`, all with the same inputs and results (to
float rounding; a test checks each against the others where it can run):

- ``"varlen"``: ``torch.nn.attention.varlen.varlen_attn``, torch's own flash kernels on
  CUDA (bf16/fp16, compute capability 8.0+). Nothing to build: the GPU default.
- ``"flash"``: flash-attn's ``flash_attn_varlen_func``, an optional extra
  (``pip install agentrl[flash]``, built from source, see the README); only when asked.
- ``"torch"``: ``scaled_dot_product_attention(is_causal=True)`` per row, exact, the rows
  of equal length stacked into one call. On CPU far faster than one SDPA over the whole
  pack with a block-diagonal mask (the mask path does T^2 work for every row; see
  bench/attention.py).

``deterministic`` asks for a backward that sums in a fixed order: flash-attn takes it as
an argument; torch's flash backward reads ``torch.use_deterministic_algorithms`` (the run
sets it with ``train.deterministic`` on a GPU, :func:`use_deterministic_kernels`); the
per-row path is deterministic already.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F

HAS_FLASH_ATTN: bool = (
    importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()
)
"""flash-attn is importable and a CUDA device is present."""

HAS_VARLEN: bool = (
    importlib.util.find_spec("torch.nn.attention.varlen") is not None
    and torch.cuda.is_available()
)
"""torch ships its varlen kernel (2.10+) and a CUDA device is present."""

Backend = Literal["varlen", "flash", "torch"]
CHOICES = ("auto", "varlen", "flash", "torch")
MIN_CAPABILITY = (8, 0)
"""torch's flash kernels need Ampere or newer."""


def resolve_backend(choice: str) -> Backend:
    """ModelConfig.attention ("auto" | "varlen" | "flash" | "torch") on this machine's
    default device and dtype: what a model built without ``choose_backend`` uses (the
    inputs' device and dtype still decide at each call, see ``varlen_attention``)."""
    if choice not in CHOICES:
        raise ValueError(f"model.attention = {choice!r}; expected one of {CHOICES}")
    if choice == "auto":
        return "varlen" if HAS_VARLEN else "torch"
    if choice == "flash" and not HAS_FLASH_ATTN:
        raise ValueError(
            'model.attention = "flash" but flash-attn is not importable or no CUDA device '
            'is present; use model.attention = "auto" (torch\'s varlen kernel, nothing to '
            "build) or install the extra: pip install agentrl[flash] --no-build-isolation")
    return choice  # type: ignore[return-value]


def choose_backend(choice: str, compute_dtype: torch.dtype, device: torch.device,
                   flash_available: bool = HAS_FLASH_ATTN,
                   capability: tuple[int, int] | None = None) -> tuple[Backend, str]:
    """The attention backend a run will use and a one-line reason (printed at start-up).

    "auto": torch's varlen kernel on a GPU of compute capability 8.0+ in bf16/fp16, else
    the exact per-row path, the reason naming the condition that failed. "varlen" and
    "flash" that cannot run are errors; "flash" needs flash-attn installed.
    """
    if choice not in CHOICES:
        raise ValueError(f"model.attention = {choice!r}; expected one of {CHOICES}")
    if choice == "torch":
        return "torch", "PyTorch SDPA per row (model.attention = \"torch\")"
    kernel = "flash-attn varlen" if choice == "flash" else "torch varlen_attn"
    why_not = _why_no_kernel(compute_dtype, device, capability)
    if why_not is None and choice == "flash" and not flash_available:
        why_not = ("flash-attn is not installed (pip install agentrl[flash] "
                   "--no-build-isolation)")
    dtype = str(compute_dtype).removeprefix("torch.")
    if why_not is None:
        return ("flash" if choice == "flash" else "varlen"), f"{kernel} ({dtype})"
    if choice != "auto":
        raise ValueError(f"model.attention = {choice!r} cannot run: {why_not}; fix that or "
                         'set model.attention = "auto"')
    return "torch", f"PyTorch SDPA per row, because {why_not}"


def _why_no_kernel(dtype: torch.dtype, device: torch.device,
                   capability: tuple[int, int] | None) -> str | None:
    if device.type != "cuda":
        return f"the model runs on {device.type}, the varlen kernels need a GPU"
    if dtype not in (torch.float16, torch.bfloat16):
        return (f"the compute dtype is {str(dtype).removeprefix('torch.')}; the varlen "
                'kernels need bfloat16 (model.dtype = "bfloat16" or "auto")')
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return (f"the GPU's compute capability is {capability[0]}.{capability[1]}; the "
                "varlen kernels need 8.0 or newer")
    return None


def use_deterministic_kernels(on_gpu: bool) -> None:
    """``train.deterministic`` on a GPU: kernels whose backward sums in a fixed order
    (torch's flash-attention backward among them; cuBLAS with a fixed workspace). An op
    with no deterministic kernel then raises instead of silently differing."""
    if not on_gpu:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    backend: Backend | None = None,
    bounds: Sequence[int] | None = None,
    deterministic: bool = False,
    prefix_of: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal attention within each row of a pack.

    q: [total, H, D]; k, v: [total, KVH, D] with H a multiple of KVH (GQA);
    cu_seqlens: int [num_rows + 1] (on q's device for the kernels); ``max_seqlen`` and
    ``bounds`` (cu_seqlens as host ints) come from the host so no backend waits for the
    GPU. Returns [total, H, D]. The kernels need a CUDA tensor in fp16/bf16; other inputs
    take the per-row path, which gives the same result. ``backend`` None: "auto".
    ``prefix_of`` (per segment, host ints; :mod:`agentrl.shared_prefix`): a segment that
    names another attends to all of that one's tokens before its own; only the per-row
    path reads it.
    """
    backend = backend or resolve_backend("auto")
    shared = bool(prefix_of) and any(p >= 0 for p in prefix_of)
    if shared:
        return _torch_per_row(q, k, v, cu_seqlens.tolist() if bounds is None else bounds,
                              prefix_of)
    if backend != "torch" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        if backend == "flash":
            return _flash(q, k, v, cu, max_seqlen, deterministic)
        return _torch_varlen(q, k, v, cu, max_seqlen)
    return _torch_per_row(q, k, v, cu_seqlens.tolist() if bounds is None else bounds)


def _torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                  max_seqlen: int) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, window_size=(-1, 0),
                       enable_gqa=k.shape[1] != q.shape[1])


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
           max_seqlen: int, deterministic: bool) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func  # lazy: optional GPU dependency

    return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True,
                                  deterministic=deterministic)


def _torch_per_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   bounds: Sequence[int], prefix_of: Sequence[int] | None = None
                   ) -> torch.Tensor:
    """Causal SDPA within each row, as few calls and copies as the rows allow.

    On CPU a pack of many short rows (GRPO: 128 completions of ~100 tokens) spends its
    time in per-call overhead and copies, and slicing each row out of q, k, v costs a
    full-size zero-and-add per slice in backward (quadratic in the rows). So the pack is
    cut with one ``split`` into runs of consecutive rows of one length that continue the
    same prefix (:func:`equal_runs`). Where some run holds several rows (a group's
    samples that all reached the token limit), every run is attended as a view of the
    pack, [n, H, L, D], with no copy: 8-layer bench micro-batch forward and backward 11.2
    to 12.2 → 8.1 to 8.4 ms. (Stacking the other rows would copy what the views already
    keep alive for backward.) Otherwise rows of one length are stacked into one call each
    (:func:`length_buckets`). The outputs are concatenated back in pack order: every
    backward is one cat or one split. A row after a shared prefix (``prefix_of``) takes
    the prefix's keys and values before its own, under a causal mask aligned to its last
    key."""
    if upcast_on_cpu(q):  # once for the pack, not per bucket in _sdpa
        return _torch_per_row(q.float(), k.float(), v.float(), bounds, prefix_of).to(q.dtype)
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    parents = list(prefix_of) if prefix_of else [-1] * len(lengths)
    runs = equal_runs(lengths, parents)
    if all(len(run) == 1 for run in runs):
        return _stacked_by_length(q, k, v, lengths, parents)
    pieces = [t.split([bounds[run[-1] + 1] - bounds[run[0]] for run in runs])
              for t in (q, k, v)]
    piece_of = {run[0]: j for j, run in enumerate(runs)}  # a prefix is a run of its own
    outs = []
    for j, run in enumerate(runs):
        if not lengths[run[0]]:
            continue
        parent = parents[run[0]]
        prefix = [kv[piece_of[parent]] for kv in pieces[1:]] if parent >= 0 else []
        outs.append(_attend_rows(pieces[0][j], pieces[1][j], pieces[2][j], len(run), *prefix))
    return torch.cat(outs) if outs else torch.zeros_like(q)


def _stacked_by_length(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       lengths: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
    """:func:`_torch_per_row` for rows cut one by one: those of one length (and prefix
    length) stacked into one SDPA call, the outputs put back in pack order."""
    rows = [t.split(list(lengths)) for t in (q, k, v)]
    outs: list[torch.Tensor | None] = [None] * len(lengths)
    spans = [lengths[p] if p >= 0 else 0 for p in parents]
    for bucket in length_buckets(lengths, spans):
        qs = torch.stack([rows[0][i] for i in bucket]).transpose(1, 2)
        if spans[bucket[0]]:
            ks, vs = ([torch.cat([r[parents[i]], r[i]]) for i in bucket] for r in rows[1:])
            attended = prefixed_attention(qs, torch.stack(ks).transpose(1, 2),
                                          torch.stack(vs).transpose(1, 2))
        else:
            ks, vs = (torch.stack([r[i] for i in bucket]).transpose(1, 2) for r in rows[1:])
            attended = causal_attention(qs, ks, vs)
        for i, out in zip(bucket, attended.transpose(1, 2).unbind(0), strict=True):
            outs[i] = out
    kept = [out for out in outs if out is not None]
    return torch.cat(kept) if kept else torch.zeros_like(q)


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int,
                 prefix_k: torch.Tensor | None = None, prefix_v: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Causal attention within each of ``rows`` rows of one length held back to back
    (q [rows * L, H, D], k/v [rows * L, KVH, D]), viewed as [rows, H, L, D] without a
    copy; each row first attends to the whole prefix (``prefix_k``/``prefix_v`` [P, KVH,
    D]) when one is given. Returns [rows * L, H, D]."""
    heads, dim = q.shape[1:]
    length = q.shape[0] // rows
    qs = q.reshape(rows, length, heads, dim).transpose(1, 2)  # a view of a packed q
    ks, vs = (t.reshape(rows, length, *t.shape[1:]) for t in (k, v))
    if prefix_k is None or prefix_v is None:
        out = causal_attention(qs, ks.transpose(1, 2), vs.transpose(1, 2))
    else:
        ks, vs = (torch.cat([prefix.expand(rows, *prefix.shape), own], dim=1)
                  for prefix, own in ((prefix_k, ks), (prefix_v, vs)))
        out = prefixed_attention(qs, ks.transpose(1, 2), vs.transpose(1, 2))
    return out.transpose(1, 2).reshape(rows * length, heads, dim)


def equal_runs(lengths: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """Segment indices cut into runs of consecutive segments of one length that continue
    the same prefix segment (``parents``, -1: none); a segment that others continue is a
    run of its own, so its keys and values are one piece of the pack."""
    continued = {p for p in parents if p >= 0}
    runs: list[list[int]] = []
    for i, (length, parent) in enumerate(zip(lengths, parents, strict=True)):
        last = runs[-1][-1] if runs else -1
        if (runs and i not in continued and last not in continued
                and lengths[last] == length and parents[last] == parent):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def upcast_on_cpu(q: torch.Tensor) -> bool:
    """Whether attention over ``q`` runs in float32: bf16/fp16 inputs on a CPU, where
    torch's SDPA is 2.5x slower in bf16 than in float32 (forward + backward of 16 rows of
    41 queries over 104 keys: 14.0 against 5.7 ms with the casts, 2 threads) and the
    float32 softmax is the more exact one."""
    return not q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def length_buckets(lengths: Sequence[int], spans: Sequence[int] | None = None
                   ) -> list[list[int]]:
    """Row indices grouped by length (and by the length of the prefix each attends to
    first, ``spans``), one attention call each, in order of first appearance. Empty rows
    are left out (they have no output)."""
    by_length: dict[tuple[int, int], list[int]] = {}
    for i, n in enumerate(lengths):
        if n > 0:
            by_length.setdefault((n, spans[i] if spans else 0), []).append(i)
    return list(by_length.values())


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA over dense rows: q [B, H, T, D], k/v [B, KVH, T, D] -> [B, H, T, D]."""
    return _sdpa(q, k, v, is_causal=True)


def prefixed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of T queries that come after a prefix: q [B, H, T, D], k/v [B, KVH,
    P + T, D] (the prefix's keys first); query t sees keys 0 .. P + t."""
    t, s = q.shape[-2], k.shape[-2]
    mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    return masked_attention(q, k, v, mask)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA with a boolean mask (True = may attend): q [N, H, T, D], k/v [N, KVH, S, D]
    (mask [N, 1, T, S] or broadcastable to it). A query attending to nothing gives 0."""
    if q.shape[-2] == 1 and not q.is_cuda and mask.dim() == 4:
        return _one_query_attention(q, k, v, mask)  # the engine's cache is float32 there
    return _sdpa(q, k, v, attn_mask=mask)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **how: Any) -> torch.Tensor:
    """torch's SDPA with grouped kv heads, in float32 where :func:`upcast_on_cpu` says."""
    if upcast_on_cpu(q):
        return _sdpa(q.float(), k.float(), v.float(), **how).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1], **how)


def _one_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
    """One query per row (the engine's batched decode) on a CPU, as two batched matmuls
    over each key/value head's group of query heads. SDPA's CPU kernel tiles for long
    queries and takes ~1 ms a call for 128 rows of one query: measured 1.06 -> 0.78 ms at
    104 keys, 3.9 -> 1.9 ms at 256 (8 query heads over 4, head dim 64, 2 threads)."""
    n, h, _, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    group = h // kvh
    scores = torch.matmul(q.reshape(n, kvh, group, d), k.transpose(-1, -2)) * d ** -0.5
    scores = scores.masked_fill(~mask.reshape(mask.shape[0], 1, 1, s), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a row with no key: zeros
    return torch.matmul(probs, v).reshape(n, h, 1, d)

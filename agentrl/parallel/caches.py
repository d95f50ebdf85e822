"""Memory a process holds past its live tensors: allocator caches given back between
phases, and oneDNN's per-shape kernel caches kept bounded."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

KERNEL_CACHE_ENTRIES = 32
"""Kernels each oneDNN cache keeps, for the most recent shapes. A bf16 matmul on a CPU
builds one kernel per (shape, pass). Each took about 1 MB on the AMX CPU of the machine
where this was measured, and every packed micro-batch and decode batch has a shape of its
own. With oneDNN's default of 1,024, the 8-layer bf16 peer bench grew by ~70 MB a step
(1.88 GB peak after 6 steps)."""

KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
"""oneDNN's primitive cache and torch's ideep cache of the kernels it wraps."""


def bound_kernel_caches(entries: int = KERNEL_CACHE_ENTRIES) -> None:
    """Cap oneDNN's kernel caches at ``entries`` so resident memory stops growing with
    each new tensor shape. A value already in the environment wins (the user's choice).
    Takes effect only before the process's first oneDNN kernel (a bf16 matmul on a CPU),
    so the command line and the run's setup call it first."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(entries))


def trim_host_heap() -> None:
    """Give glibc's freed heap back to the system (``malloc_trim``). Without it the
    process keeps the peak of one phase (the update's activations) through the next, and
    that phase's peak adds on top. A no-op where the C library is not glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_cached_memory() -> None:
    """Hand back what freed tensors leave cached: the CUDA allocator's blocks, so that a
    colocated vLLM replica waking up finds them free (it allocates outside torch's
    cache), and the host heap (:func:`trim_host_heap`)."""
    import torch  # here: the command line bounds the caches before torch is imported

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    trim_host_heap()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None

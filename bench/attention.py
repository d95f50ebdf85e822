"""Per-row SDPA loop vs one block-diagonal-masked SDPA over a packed batch (CPU).

Prints times and the ratio, measured side by side in the same run. The per-row loop is
what agentrl.model.attention uses when flash-attn is absent.

    PYTHONPATH=. python bench/attention.py [--tokens 8192 --rows 20 --heads 8 --head-dim 64]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from agentrl.model.attention import varlen_attention


def row_lengths(total: int, num_rows: int, seed: int = 0) -> list[int]:
    """Uneven row lengths summing to total (like rollouts of different lengths)."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(num_rows, generator=gen) + 0.2
    lengths = (weights / weights.sum() * total).floor().long()
    lengths[-1] += total - int(lengths.sum())
    return lengths.tolist()


def block_diagonal_mask(lengths: list[int]) -> torch.Tensor:
    """[T, T] bool: True where query may attend key (same row, not in the future)."""
    row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.arange(len(row))
    return (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])


def masked(q, k, v, mask):
    # [T, H, D] -> [1, H, T, D]; one SDPA over the whole pack
    out = F.scaled_dot_product_attention(
        *(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), attn_mask=mask
    )
    return out.squeeze(0).transpose(0, 1)


def timed(fn: Callable[[], torch.Tensor], backward: bool, repeats: int) -> float:
    """Best wall time of repeats (after one warm-up)."""
    best = float("inf")
    for i in range(repeats + 1):
        start = time.perf_counter()
        out = fn()
        if backward:
            out.sum().backward()
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    lengths = row_lengths(a.tokens, a.rows)
    cu = torch.cumsum(torch.tensor([0, *lengths]), 0)
    mask = block_diagonal_mask(lengths)
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(a.tokens, a.heads, a.head_dim, generator=gen) for _ in range(3)]
    with torch.no_grad():
        diff = (varlen_attention(*qkv, cu, max(lengths)) - masked(*qkv, mask)).abs().max()
    print(
        f"{a.tokens} tokens in {a.rows} rows, {a.heads} heads x {a.head_dim}, "
        f"{a.threads} thread(s); max |per-row - masked| = {diff:.2e}"
    )
    for backward in (False, True):
        leaves = [t.clone().requires_grad_(backward) for t in qkv]
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx:
            loop = timed(
                lambda x=leaves: varlen_attention(*x, cu, max(lengths)), backward, a.repeats
            )
            mask_t = timed(lambda x=leaves: masked(*x, mask), backward, a.repeats)
        name = "forward+backward" if backward else "forward"
        print(
            f"{name:>17}: per-row loop {loop * 1e3:8.1f} ms | block-diagonal mask "
            f"{mask_t * 1e3:8.1f} ms | mask / loop = {mask_t / loop:5.1f}x"
        )


if __name__ == "__main__":
    main()

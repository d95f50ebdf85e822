"""Balance across 8 data-parallel ranks: estimated FLOPs (a·L + b·L²) vs a token-count split.

Same long-tailed rows as bench/packing.py. Each split is scored by the same FLOPs
estimate (a 7B-class shape, where attention is a large share on 16k rows): max / mean
rank cost, 1.0 being even. The slowest rank sets the update's time, so max / mean is the
speed-up left on the table.

    python -m bench.balance
"""

from __future__ import annotations

import time

import numpy as np

from agentrl.packing import CostModel, balance
from bench.packing import long_tailed_lengths

NUM_RANKS = 8
FLOPS = CostModel.from_model_args(hidden=3584, layers=28, intermediate=18944, vocab=152064,
                                  num_kv_heads_ratio=4 / 28)


def max_over_mean(lengths: list[int], ranks: list[list[int]]) -> float:
    """Max / mean estimated FLOPs over ranks."""
    costs = [sum(FLOPS.cost(lengths[i]) for i in r) for r in ranks]
    return max(costs) / (sum(costs) / len(costs))


def contiguous(num_rows: int, num_ranks: int) -> list[list[int]]:
    """The naive data-parallel split: equal row counts, in arrival order."""
    return [list(part) for part in np.array_split(np.arange(num_rows), num_ranks)]


def main() -> None:
    tokens_only = CostModel(a=1.0, b=0.0)
    for num_rows in (2000, 256):
        lengths = long_tailed_lengths()[:num_rows]
        start = time.perf_counter()
        by_flops = balance(lengths, NUM_RANKS, FLOPS)
        elapsed = time.perf_counter() - start
        by_tokens = balance(lengths, NUM_RANKS, tokens_only)
        b_flops = max_over_mean(lengths, by_flops)
        b_tokens = max_over_mean(lengths, by_tokens)
        b_naive = max_over_mean(lengths, contiguous(len(lengths), NUM_RANKS))
        print(f"{num_rows} rows on {NUM_RANKS} ranks (max/mean estimated FLOPs; goal <= 1.03):")
        print(f"  balanced by FLOPs:        {b_flops:.4f}  ({elapsed * 1e3:.0f} ms)")
        print(f"  balanced by token count:  {b_tokens:.4f}")
        print(f"  equal row counts:         {b_naive:.4f}")
        print(f"  slowest-rank time, token split / FLOPs split: {b_tokens / b_flops:.3f}x")


if __name__ == "__main__":
    main()

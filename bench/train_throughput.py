"""CPU training throughput of the tiny decoder: packed micro-batches vs padded batches.

The same rows, the same token budget per micro-batch, the same loss; one forward/backward
over all rows (one update) per measurement, the two layouts timed alternately in one run.
Packed should win by about the density ratio (real tokens / computed tokens).

    python -m bench.train_throughput
"""

from __future__ import annotations

import time

import numpy as np
import torch

from agentrl.config import LossConfig
from agentrl.loss import policy_loss
from agentrl.model import ModelArgs
from agentrl.model.tiny import init_model
from agentrl.packing import collate, pack
from agentrl.train.update import forward_backward
from agentrl.types import Row

BUDGET = 1024
NUM_ROWS = 96
CFG = LossConfig()
ARGS = ModelArgs(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def make_rows(seed: int = 0) -> list[Row]:
    """Long-tailed rows (median ~64 tokens, up to BUDGET / 2): prompt then generation."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.normal(np.log(64), 0.9, NUM_ROWS)).astype(int).clip(8, BUDGET // 2)
    rows = []
    for k, n in enumerate(lengths.tolist()):
        num_prompt = n // 4
        mask = [0] * num_prompt + [1] * (n - num_prompt)
        rows.append(Row(rollout_id=str(k), group_id="g", env="e", segment=0,
                        token_ids=rng.integers(0, ARGS.vocab_size, n).tolist(), loss_mask=mask,
                        logprobs=[-1.0 * m for m in mask], reward=0.0))
    return rows


def run_packed(model: torch.nn.Module, rows: list[Row], advantages: list[float]) -> int:
    """One update over packed micro-batches; returns tokens computed (= real tokens)."""
    groups = pack([len(r.token_ids) for r in rows], BUDGET)
    mbs = [collate(rows, advantages, g) for g in groups]
    forward_backward(model, mbs, CFG)
    return sum(int(mb.input_ids.numel()) for mb in mbs)


def run_padded(model: torch.nn.Module, rows: list[Row], advantages: list[float]) -> int:
    """One update over fixed-size batches padded to their longest row; returns tokens computed.

    Rows are collated one by one (so targets and masks are identical to the packed path),
    then right-padded into [B, T] with B = BUDGET // longest row.
    """
    per_batch = max(1, BUDGET // max(len(r.token_ids) for r in rows))
    singles = [collate(rows, advantages, [i]) for i in range(len(rows))]
    num_tokens = sum(mb.num_tokens for mb in singles)
    computed = 0
    for start in range(0, len(singles), per_batch):
        chunk = singles[start : start + per_batch]
        width = max(mb.input_ids.shape[1] for mb in chunk)

        def pad(name: str, chunk: list = chunk, width: int = width) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(getattr(mb, name),
                                                      (0, width - mb.input_ids.shape[1]))
                              for mb in chunk])

        logprobs = model(pad("input_ids"), None, None, targets=pad("target_ids")).logprobs
        loss, _ = policy_loss(logprobs, pad("old_logprobs"), pad("advantages"),
                              pad("loss_mask"), num_tokens, CFG,
                              engine_logprobs=pad("engine_logprobs"))
        loss.backward()
        computed += len(chunk) * width
    return computed


def main() -> None:
    torch.set_num_threads(1)
    model = init_model(ARGS, seed=0)
    rows = make_rows()
    advantages = [float(k % 3 - 1) for k in range(len(rows))]
    real = sum(len(r.token_ids) for r in rows)
    best = {"packed": float("inf"), "padded": float("inf")}
    computed = {}
    for _ in range(3):  # alternate, keep the best of each: the machine is shared
        for name, fn in (("packed", run_packed), ("padded", run_padded)):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            computed[name] = fn(model, rows, advantages)
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"{len(rows)} rows, {real} real tokens, budget {BUDGET}, model hidden "
          f"{ARGS.hidden_size} × {ARGS.num_hidden_layers} layers, 1 CPU thread")
    for name in ("packed", "padded"):
        print(f"  {name}: {computed[name]} tokens computed (density {real / computed[name]:.3f}),"
              f" {best[name]:.3f} s per update, {real / best[name]:.0f} real tokens/s")
    grads = []
    for fn in (run_packed, run_padded):  # same rows, same loss: the layouts must agree
        model.zero_grad(set_to_none=True)
        fn(model, rows, advantages)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    print(f"  max |grad packed - grad padded|: {float((grads[0] - grads[1]).abs().max()):.2e}")
    print(f"  speed-up packed / padded: {best['padded'] / best['packed']:.2f}x; "
          f"density ratio: {computed['padded'] / computed['packed']:.2f}x")


if __name__ == "__main__":
    main()

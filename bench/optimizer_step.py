"""AdamW's step as the trainer builds it (fused, ``agentrl.train.optimizer``) against
torch's default CPU implementation (one kernel per operation, parameter by parameter).

    python -m bench.optimizer_step [--steps 5] [--threads 2]

On the bench's larger shape (8 layers, hidden 512, 26 M parameters, ``bench.shapes``):
the median seconds of ``--steps`` optimizer steps each way, alternating in one process,
their ratio, and how far the parameters of the two ways lie apart after the same steps
with the same gradients.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentrl.config import OptimConfig
from agentrl.train.optimizer import build_optimizer
from bench.shapes import large_model


def optimizer(model: torch.nn.Module, fused: bool) -> torch.optim.Optimizer:
    """The trainer's optimizer for ``model``, or torch's default one with ``fused`` off."""
    config = OptimConfig(lr=3e-4)
    if fused:
        return build_optimizer(model, config)
    return torch.optim.AdamW(model.parameters(), lr=config.lr, betas=tuple(config.betas),
                             weight_decay=config.weight_decay)


def main() -> None:
    """Time both ways and print the ratio and the largest parameter difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {fused: large_model() for fused in (False, True)}
    optimizers = {fused: optimizer(model, fused) for fused, model in models.items()}
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=generator) for p in models[False].parameters()]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for step in range(args.steps + 1):
        for fused in (False, True):
            for p, g in zip(models[fused].parameters(), grads, strict=True):
                p.grad = g * (step + 1)
            start = time.perf_counter()
            optimizers[fused].step()
            if step:  # the first step allocates the state
                seconds[fused].append(time.perf_counter() - start)
    medians = statistics.median(seconds[False]), statistics.median(seconds[True])
    apart = max((a - b).abs().max().item() for a, b in zip(
        models[False].parameters(), models[True].parameters(), strict=True))
    print(f"AdamW step, {sum(p.numel() for p in grads) / 1e6:.1f} M parameters, "
          f"{args.threads} threads: torch default {medians[0]:.4f} s, fused (the "
          f"trainer's) {medians[1]:.4f} s, ratio {medians[0] / medians[1]:.2f}x; "
          f"parameters apart by at most {apart:.1e} after {args.steps + 1} steps")


if __name__ == "__main__":
    main()

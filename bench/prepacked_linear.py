"""Linear weights packed once for MKL's GEMM (``agentrl.model.prepacked``) against
``F.linear``, which repacks the weight at every call.

    python -m bench.prepacked_linear [--rows 1 2 4 8 16 32 64 128 256 512] [--repeats 3]

Two parts, both on the bench's larger shape (8 layers, hidden 512, ``bench.shapes``), 2
threads, the two ways alternating in one process:

1. the projections of all 8 layers (q, k, v, o, gate, up, down) at each row count, the
   median milliseconds of each way and their ratio;
2. the built-in engine generating 16 prompts × 8 samples × 40 tokens (temperature 1, each
   request seeded) with prepacking off and on: median seconds of ``--repeats``
   collections, the ratio, and whether the two ways sampled the same tokens (and how far
   their log-probs differ).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model.prepacked import can_prepack, drop_prepacked, linear, prepack_linears
from bench.shapes import large_model, time_collection

GROUPS, SAMPLES, NEW_TOKENS, PROMPT_TOKENS = 16, 8, 40, 64


def projections_ms(model: torch.nn.Module, rows: int, prepacked: bool) -> float:
    """Milliseconds for every projection of every layer once at ``rows`` rows."""
    layers = [(module, torch.randn(rows, module.in_features))
              for layer in model.model.layers
              for module in (*[getattr(layer.self_attn, f"{p}_proj") for p in "qkvo"],
                             layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    if prepacked:
        prepack_linears(model)
    else:
        drop_prepacked(model)

    def once() -> None:
        for module, x in layers:
            linear(module, x, module.bias) if prepacked else F.linear(x, module.weight,
                                                                      module.bias)

    with torch.inference_mode():
        for _ in range(3):
            once()
        start, repeats = time.perf_counter(), max(3, 2048 // rows)
        for _ in range(repeats):
            once()
    return (time.perf_counter() - start) / repeats * 1e3


def collect(model: torch.nn.Module, prompts: list[list[int]], prepacked: bool
            ) -> tuple[float, list]:
    """Seconds to generate every sample of every prompt, and the generations."""
    drop_prepacked(model)
    engine = TorchEngine(model, max_batch_size=GROUPS * SAMPLES, max_len=4096)
    engine.prepack_weights = prepacked
    return time_collection(engine, prompts, SAMPLES, lambda i: SamplingParams(
        temperature=1.0, max_tokens=NEW_TOKENS, seed=i))


def main() -> None:
    """Run both parts and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+",
                        default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = large_model().eval()
    if not can_prepack(model.lm_head.weight):
        raise SystemExit("this torch has no MKL: nothing to prepack")
    print("projections of 8 layers (hidden 512), ms: F.linear | prepacked | ratio")
    for rows in args.rows:
        plain = statistics.median(projections_ms(model, rows, False) for _ in range(3))
        packed = statistics.median(projections_ms(model, rows, True) for _ in range(3))
        print(f"  {rows:4d} rows  {plain:7.2f}  {packed:7.2f}  {plain / packed:5.2f}x")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (PROMPT_TOKENS,), generator=g).tolist()
               for _ in range(GROUPS)]
    collect(model, prompts, True)  # warm-up
    seconds: dict[bool, list[float]] = {False: [], True: []}
    outputs = {}
    for _ in range(args.repeats):
        for prepacked in (False, True):
            took, outputs[prepacked] = collect(model, prompts, prepacked)
            seconds[prepacked].append(took)
    plain, packed = (statistics.median(seconds[k]) for k in (False, True))
    pairs = list(zip(outputs[False], outputs[True], strict=True))
    same = sum(a.token_ids == b.token_ids for a, b in pairs)
    drift = max(abs(x - y) for a, b in pairs if a.token_ids == b.token_ids
                for x, y in zip(a.logprobs, b.logprobs, strict=True))
    print(f"engine, {GROUPS} prompts x {SAMPLES} samples x {NEW_TOKENS} tokens: "
          f"{plain:.2f} s -> {packed:.2f} s prepacked, {plain / packed:.2f}x; "
          f"same tokens in {same}/{len(pairs)} requests, log-probs within {drift:.1e}")


if __name__ == "__main__":
    main()

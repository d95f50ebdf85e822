"""Does a request's output depend on its batch? And what does batch invariance cost?

    python -m bench.batch_invariance [--hidden 64] [--prompts 8] [--tokens 32]

1. The same request decoded alone and next to others in the TorchEngine (default mode):
   how many of its log-probs are bit-equal, and the largest difference.
2. The same with ``batch_invariant=True`` (what ``train.deterministic`` turns on).
3. Tokens/s of the default engine, the batch-invariant engine, and serial generation
   (one slot), side by side in this run, with all slots busy and with a quarter of them.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from bench.engine_throughput import tiny_model


async def _all(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, params) for p in prompts))


def compare(model, prompts, tokens, invariant: bool) -> tuple[int, int, float]:
    """(bit-equal log-probs, total, max |diff|) of prompt 0 alone vs in the full batch."""
    params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=7)
    kwargs = {"max_batch_size": len(prompts), "max_len": 256, "batch_invariant": invariant}
    alone = asyncio.run(TorchEngine(model, **kwargs).generate(prompts[0], params))
    batched = asyncio.run(_all(TorchEngine(model, **kwargs), prompts, params))[0]
    pairs = list(zip(alone.logprobs, batched.logprobs, strict=False))
    diff = max(abs(a - b) for a, b in pairs)
    return sum(a == b for a, b in pairs), len(pairs), diff


def tokens_per_s(model, prompts, tokens, slots: int, invariant: bool) -> float:
    """Greedy generation of every prompt with ``slots`` cache slots."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    engine = TorchEngine(model, max_batch_size=slots, max_len=256, batch_invariant=invariant)
    start = time.perf_counter()
    asyncio.run(_all(engine, prompts, params))
    return len(prompts) * tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_model(args.hidden)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 390, (int(n),), generator=gen).tolist()
               for n in torch.randint(20, 120, (args.prompts,), generator=gen)]
    print(f"hidden {args.hidden}, {args.prompts} prompts × {args.tokens} tokens, 1 thread")
    for invariant in (False, True):
        equal, total, diff = compare(model, prompts, args.tokens, invariant)
        name = "batch-invariant" if invariant else "default"
        print(f"{name:16s}: alone vs in a batch of {args.prompts}: {equal}/{total} log-probs "
              f"bit-equal, max |diff| {diff:.2e}")
    quarter = prompts[: max(1, len(prompts) // 4)]
    default = tokens_per_s(model, prompts, args.tokens, len(prompts), False)
    invariant = tokens_per_s(model, prompts, args.tokens, len(prompts), True)
    serial = tokens_per_s(model, prompts, args.tokens, 1, False)
    default_q = tokens_per_s(model, quarter, args.tokens, len(prompts), False)
    invariant_q = tokens_per_s(model, quarter, args.tokens, len(prompts), True)
    print(f"all slots busy : default {default:8.0f} tok/s | batch-invariant {invariant:8.0f} "
          f"({invariant / default:.2f}×) | serial {serial:8.0f} ({serial / default:.2f}×)")
    print(f"1/4 slots busy : default {default_q:8.0f} tok/s | batch-invariant "
          f"{invariant_q:8.0f} ({invariant_q / default_q:.2f}×)")


if __name__ == "__main__":
    main()

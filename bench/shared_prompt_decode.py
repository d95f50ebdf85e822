"""The built-in engine decoding groups of samples of one prompt, reading each group's
prompt once per step (``agentrl.model.cascade``) against reading every slot's copy.

    python -m bench.shared_prompt_decode [--prompt-lens 64 512] [--dtypes float32 bfloat16]

The bench's larger shape (8 layers, hidden 512, random weights), 16 prompts × 8 samples,
40 new tokens each at temperature 1, 2 threads; both ways alternate in one process, and
the table gives the median seconds of ``--repeats`` collections and their ratio. Before
timing, a greedy collection each way checks the tokens agree (float32: exactly; bf16 may
round some near-ties the other way) and prints how far the log-probs differ.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from bench.shapes import LARGE, large_model, time_collection

GROUPS, SAMPLES, NEW_TOKENS = 16, 8, 40


def collect(model: torch.nn.Module, prompts: list[list[int]], share: bool,
            temperature: float) -> tuple[float, list]:
    """Seconds to generate every sample of every prompt (groups interleaved, as rollouts
    arrive), and the generations."""
    engine = TorchEngine(model, max_batch_size=GROUPS * SAMPLES, max_len=4096)
    engine.share_prefixes = share
    params = SamplingParams(temperature=temperature, max_tokens=NEW_TOKENS)
    return time_collection(engine, prompts, SAMPLES, lambda _: params)


def main() -> None:
    """Print one row per prompt length and dtype."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    base = large_model().eval()
    print(f"{GROUPS} prompts × {SAMPLES} samples × {NEW_TOKENS} tokens, 8 layers, hidden 512, "
          "2 threads; median of", args.repeats)
    print(f"{'prompt':>6} {'dtype':>9} {'every copy s':>12} {'once s':>7} {'speed-up':>8}  "
          "greedy equal, max |Δ logprob| there")
    for dtype in args.dtypes:
        model = copy.deepcopy(base).to(getattr(torch, dtype))
        for length in args.prompt_lens:
            gen = torch.Generator().manual_seed(length)
            prompts = [torch.randint(0, LARGE["vocab_size"], (length + g % 5,),
                                     generator=gen).tolist() for g in range(GROUPS)]
            _, plain = collect(model, prompts, False, 0.0)
            _, shared = collect(model, prompts, True, 0.0)
            same = [(a, b) for a, b in zip(plain, shared, strict=True)
                    if a.token_ids == b.token_ids]
            delta = max((abs(x - y) for a, b in same
                         for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
            equal = len(same)
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeats):
                for share in (False, True):
                    times[share].append(collect(model, prompts, share, 1.0)[0])
            every, once = (statistics.median(times[s]) for s in (False, True))
            print(f"{length:>6} {dtype:>9} {every:>12.2f} {once:>7.2f} {every / once:>7.2f}×  "
                  f"{equal}/{len(plain)}, {delta:.1e}")


if __name__ == "__main__":
    main()

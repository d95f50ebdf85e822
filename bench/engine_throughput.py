"""TorchEngine (KV cache + continuous batching) vs naive generation (a full forward over
the whole sequence for every new token, one prompt at a time), same prompts, same model.

    python bench/engine_throughput.py [--prompts 8] [--tokens 48] [--hidden 64]

Prints tokens/s of both and their ratio, measured side by side in this run, and checks
that both produce the same greedy tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained


def naive_generate(model, prompt: list[int], num_tokens: int) -> list[int]:
    """Full re-forward of the whole sequence for each new token (greedy)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


async def engine_generate(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, params) for p in prompts))


def tiny_model(hidden: int) -> torch.nn.Module:
    """A tiny checkpoint of the given width, built in a temp folder, in eval mode."""
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_checkpoint(Path(tmp) / "m", hidden_size=hidden, vocab_size=400)
        return load_pretrained(path, attention="torch").eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_model(args.hidden)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 390, (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.prompts)]
    total = args.prompts * args.tokens
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    engine = TorchEngine(model, max_batch_size=args.prompts,
                         max_len=args.prompt_len + args.tokens + 1)

    start = time.perf_counter()
    naive = [naive_generate(model, p, args.tokens) for p in prompts]
    naive_s = time.perf_counter() - start
    start = time.perf_counter()
    cached = asyncio.run(engine_generate(engine, prompts, params))
    engine_s = time.perf_counter() - start

    same = sum(a == b.token_ids for a, b in zip(naive, cached, strict=True))
    print(f"{args.prompts} prompts × {args.tokens} tokens (prompt {args.prompt_len}, "
          f"hidden {args.hidden}, 1 thread)")
    print(f"naive uncached : {total / naive_s:9.1f} tokens/s  ({naive_s:.2f} s)")
    print(f"TorchEngine    : {total / engine_s:9.1f} tokens/s  ({engine_s:.2f} s, "
          f"{engine.num_forwards} forwards)")
    print(f"speed-up       : {naive_s / engine_s:9.2f}×")
    print(f"identical greedy outputs: {same}/{args.prompts}")


if __name__ == "__main__":
    main()

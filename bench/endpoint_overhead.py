"""The OpenAI-compatible endpoint's overhead per request, against direct engine calls.

    python bench/endpoint_overhead.py [--requests 40] [--turns 8] [--tokens 8]

Both paths generate the same greedy tokens on the same built-in engine (a tiny model, on
one event loop thread). "direct" is ``engine.generate(prompt_ids)`` with the ids ready;
"endpoint" is the official ``openai`` client from another thread: HTTP, the request
checked, the chat template rendered into ids (for a conversation: only the delta after
the ids of the previous reply), the reply parsed for tool calls and recorded. Printed:
milliseconds per request of each, their difference (the overhead) and ratio, for
single-turn requests and for the requests of ``--turns``-turn conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import openai

from agentrl.config import RolloutConfig
from agentrl.engines.chat_server import ChatServer, serve_on_thread
from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.rollout.harness_endpoint import serving_sessions

TASK = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12 + 30? Use the calculator."}]


def start(folder: Path) -> tuple[TorchEngine, asyncio.AbstractEventLoop, int]:
    """A tiny engine and the endpoint over it, on a loop of their own (a thread)."""
    build_tiny_checkpoint(folder, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    tokenizer = load_tokenizer(folder)
    model = load_pretrained(folder, attention="torch").eval().requires_grad_(False)
    engine = TorchEngine(model, tokenizer, max_batch_size=4, max_len=2048)
    server = ChatServer(engine, tokenizer, "tiny",
                        serving_sessions(engine, tokenizer, RolloutConfig(max_new_tokens=64)))
    loop, port = serve_on_thread(server)
    return engine, loop, port


def direct(generate, loop, calls: list[tuple[list[int], SamplingParams]]
           ) -> tuple[float, int]:
    """Seconds for the same prompts and settings through the engine's own ``generate``,
    one after another, and the tokens."""
    num_tokens, start_s = 0, time.perf_counter()
    for ids, params in calls:
        num_tokens += len(asyncio.run_coroutine_threadsafe(generate(ids, params), loop)
                          .result().token_ids)
    return time.perf_counter() - start_s, num_tokens


def through_endpoint(port: int, conversations: int, turns: int, tokens: int) -> float:
    """Seconds for ``conversations`` × ``turns`` requests (each turn extends the last)."""
    start_s = time.perf_counter()
    for n in range(conversations):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=f"bench-{n}")
        messages = list(TASK)
        for turn in range(turns):
            reply = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=tokens, temperature=0.0,
                stop=None).choices[0].message
            messages += [reply.model_dump(exclude_none=True),
                         {"role": "user", "content": f"Turn {turn} done."}]
    return time.perf_counter() - start_s


def main() -> None:
    """Measure both paths side by side and print the overhead."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine, loop, port = start(Path(tmp) / "tiny")
        calls: list[tuple[list[int], SamplingParams]] = []
        generate = engine.generate
        generated = [0]

        async def remember(prompt_ids, params, key=None):  # what the endpoint asked for
            calls.append((list(prompt_ids), params))
            generation = await generate(prompt_ids, params, key=key)
            generated[0] += len(generation.token_ids)
            return generation

        engine.generate = remember  # type: ignore[method-assign]
        through_endpoint(port, 2, 2, args.tokens)  # warm up both paths
        multi = (f"{args.turns}-turn", max(args.requests // args.turns, 1), args.turns)
        for label, conversations, turns in (("single-turn", args.requests, 1), multi):
            calls.clear()
            generated[0] = 0
            served_s = through_endpoint(port, conversations, turns, args.tokens)
            direct_s, direct_tokens = direct(generate, loop, list(calls))
            assert direct_tokens == generated[0], "the two paths generated differently"
            n = len(calls)
            per_direct, per_served = 1e3 * direct_s / n, 1e3 * served_s / n
            print(f"{label:>12}: {n} requests, direct {per_direct:.2f} ms/request, endpoint "
                  f"{per_served:.2f} ms/request: overhead {per_served - per_direct:+.2f} ms "
                  f"({per_served / per_direct:.2f}x), mean prompt "
                  f"{sum(len(p) for p, _ in calls) / n:.0f} tokens, "
                  f"{generated[0] / n:.1f} generated")

if __name__ == "__main__":
    main()

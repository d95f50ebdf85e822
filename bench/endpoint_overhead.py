"""The OpenAI-compatible endpoint's overhead per request, against direct engine calls.

    python -m bench.endpoint_overhead [--requests 40] [--turns 8] [--tokens 8] [--rounds 7]

Both paths generate the same greedy tokens on the same built-in engine (a tiny model, on
one event loop thread), with the same cache: every request names its conversation, so
both reuse the KV cache of a conversation's previous turn. "direct" is
``engine.generate(prompt_ids, params, key)`` with the ids ready (the ones the endpoint
rendered, the key a conversation of its own); "endpoint" is one official ``openai``
client (built once, outside the timing) from another thread, the conversation's session
in the ``X-Agentrl-Session`` header: HTTP (a connection per request), the request
checked, the chat template rendered into ids (for a conversation: only the delta after
the ids of the previous reply), generation keyed by the session, the reply parsed for
tool calls and recorded.

The arms alternate over ``--rounds`` rounds (which goes first alternates too), each
round with conversations of its own, so load that comes and goes falls on both. Printed,
for single-turn requests and for the requests of ``--turns``-turn conversations: the
median milliseconds per request of each arm, the median of the rounds' differences (the
overhead) with its range, their ratio; and the machine's load before and after.

Every torch op runs single-threaded (on a small shared machine threads only fight).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import openai
import torch

from agentrl.config import RolloutConfig
from agentrl.engines.chat_server import ChatServer, serve_on_thread
from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.rollout.harness_endpoint import serving_sessions

TASK = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12 + 30? Use the calculator."}]
Call = tuple[list[int], SamplingParams, str | None]
"""One engine call: prompt ids, sampling settings, the conversation's key."""


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


def direct(generate: Callable, loop: asyncio.AbstractEventLoop, calls: list[Call],
           prefix: str) -> tuple[float, int]:
    """Seconds for the same prompts and settings through the engine's own ``generate``,
    one after another, each under its conversation's key made this round's own by
    ``prefix``; and the tokens generated."""
    num_tokens, start_s = 0, time.perf_counter()
    for ids, params, key in calls:
        generation = asyncio.run_coroutine_threadsafe(
            generate(ids, params, key=f"{prefix}{key}"), loop).result()
        num_tokens += len(generation.token_ids)
    return time.perf_counter() - start_s, num_tokens


def through_endpoint(client: openai.OpenAI, prefix: str, conversations: int, turns: int,
                     tokens: int) -> float:
    """Seconds for ``conversations`` × ``turns`` requests (each turn extends the last),
    conversation n in the session ``prefix`` + n."""
    start_s = time.perf_counter()
    for n in range(conversations):
        session = {"X-Agentrl-Session": f"{prefix}{n}"}
        messages = list(TASK)
        for turn in range(turns):
            reply = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=tokens, temperature=0.0,
                extra_headers=session).choices[0].message
            messages += [reply.model_dump(exclude_none=True),
                         {"role": "user", "content": f"Turn {turn} done."}]
    return time.perf_counter() - start_s


def load() -> str:
    """The 1, 5 and 15 minute load averages, as text."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def report(label: str, calls: list[Call], per_direct: list[float], per_served: list[float],
           num_generated: int) -> None:
    """Print one shape's medians over the rounds (milliseconds per request)."""
    overheads = sorted(s - d for d, s in zip(per_direct, per_served, strict=True))
    direct_ms, served_ms = statistics.median(per_direct), statistics.median(per_served)
    n = len(calls)
    print(f"{label:>12}: {n} requests x {len(overheads)} rounds, median direct "
          f"{direct_ms:.2f} ms/request, endpoint {served_ms:.2f} ms/request: overhead "
          f"{statistics.median(overheads):+.2f} ms (rounds {overheads[0]:+.2f} .. "
          f"{overheads[-1]:+.2f}; {served_ms / direct_ms:.2f}x), mean prompt "
          f"{sum(len(p) for p, _, _ in calls) / n:.0f} tokens, {num_generated / n:.1f} "
          "generated", flush=True)


def record(engine: TorchEngine, client: openai.OpenAI, label: str, conversations: int,
           turns: int, tokens: int) -> tuple[list[Call], int]:
    """The engine calls the endpoint makes for one shape's conversations (an untimed pass,
    the direct arm's script in every round), and the tokens they generated."""
    calls: list[Call] = []
    generated = [0]
    generate = engine.generate

    async def remember(prompt_ids, params, key=None):
        calls.append((list(prompt_ids), params, key))
        generation = await generate(prompt_ids, params, key=key)
        generated[0] += len(generation.token_ids)
        return generation

    engine.generate = remember  # type: ignore[method-assign]
    try:
        through_endpoint(client, f"{label}-script-", conversations, turns, tokens)
    finally:
        del engine.generate  # the rounds time the engine's own method
    return calls, generated[0]


def measure(engine: TorchEngine, loop: asyncio.AbstractEventLoop, client: openai.OpenAI,
            shape: tuple[str, int, int], tokens: int, rounds: int) -> None:
    """Time one shape's conversations both ways, alternating over the rounds; print."""
    label, conversations, turns = shape
    script, num_generated = record(engine, client, label, conversations, turns, tokens)
    per_direct: list[float] = []
    per_served: list[float] = []
    for r in range(rounds):
        served_s = direct_s = 0.0
        for arm in ("endpoint", "direct") if r % 2 == 0 else ("direct", "endpoint"):
            if arm == "endpoint":
                served_s = through_endpoint(client, f"{label}-{r}-", conversations, turns,
                                            tokens)
            else:
                direct_s, num_tokens = direct(engine.generate, loop, script, f"{r}-")
                assert num_tokens == num_generated, "the two paths generated differently"
        per_direct.append(1e3 * direct_s / len(script))
        per_served.append(1e3 * served_s / len(script))
    report(label, script, per_direct, per_served, num_generated)


def main() -> None:
    """Measure both paths, alternating, and print the overhead."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load before: {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine, loop, port = start(Path(tmp) / "tiny")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench")
        warm_up, _ = record(engine, client, "warm", 2, 2, args.tokens)  # both paths
        direct(engine.generate, loop, warm_up, "warm-")
        multi = (f"{args.turns}-turn", max(args.requests // args.turns, 1), args.turns)
        for shape in (("single-turn", args.requests, 1), multi):
            measure(engine, loop, client, shape, args.tokens, args.rounds)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()

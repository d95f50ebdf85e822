"""The training phase of one GRPO step on CPU, this checkout against a baseline checkout.

The work of ``time/train`` at the TRL peer's shape (bench/peers/trl_grpo.py): 16 groups ×
8 samples = 128 rows, each a 64-token prompt shared by its group and 10..40 generated
tokens, one optimizer update (pack, collate with each group's prompt held once as the
trainer does on a CPU, or every row whole with ``--no-share``; forward/backward with the
token-level loss, gradient clipping, AdamW). ``small`` is the quickstart warm start (2
layers, hidden 128); ``large`` an 8-layer, 512-hidden decoder of the same vocabulary
(``bench.shapes``), held as the trainer holds it on one CPU rank. Each arm runs in its
own processes (agentrl imported from that arm's checkout), the arms alternating so both
see the same machine load; it prints the median seconds per update of each (wall clock
and CPU time: the machine is shared), the peak RSS, the speed-up, and how far the two
updates' loss and gradient norm differ (the algorithm must not change).

    python -m bench.train_step --baseline /path/to/main/checkout [--shapes small large]
    python -m bench.train_step --compile [--shapes small large]   # eager vs model.compile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_GROUPS, GROUP_SIZE, PROMPT_TOKENS = 16, 8, 64


def worker(model_path: Path, steps: int, threads: int, compile_layers: bool, budget: int,
           share: bool) -> None:
    """Time ``steps`` updates (after one warm-up) of the checkpoint at ``model_path`` and
    print one JSON line (run in a child whose PYTHONPATH names the checkout to measure; it
    imports nothing from bench/, which the baseline checkout may lack). ``share``: pack
    as the trainer does on a CPU, each group's prompt once (where the checkout can)."""
    import resource

    import numpy as np
    import torch

    import agentrl
    from agentrl.config import LossConfig, OptimConfig
    from agentrl.packing import collate, pack
    from agentrl.parallel.fsdp import clip_grad_norm
    from agentrl.train.optimizer import build_optimizer
    from agentrl.train.update import forward_backward
    from agentrl.types import Row

    torch.set_num_threads(threads)
    model = trainer_layout(model_path)
    if compile_layers:
        from agentrl.model.compile import compile_model

        compile_model(model)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    rows, advantages = [], []
    for g in range(NUM_GROUPS):
        prompt = rng.integers(0, vocab, PROMPT_TOKENS).tolist()
        for s in range(GROUP_SIZE):
            generated = int(rng.integers(10, 41))
            mask = [0] * PROMPT_TOKENS + [1] * generated
            rows.append(Row(rollout_id=f"{g}-{s}", group_id=str(g), env="e", segment=0,
                            token_ids=prompt + rng.integers(0, vocab, generated).tolist(),
                            loss_mask=mask, logprobs=[-7.0 * m for m in mask], reward=0.0))
            advantages.append(float(rng.normal()))
    optimizer = build_optimizer(model, OptimConfig(lr=3e-4))
    try:
        from agentrl.shared_prefix import packing_units
    except ImportError:  # a checkout from before shared prefixes
        share = False
    units, lengths = (packing_units(rows, range(len(rows)), budget) if share else
                      ([[i] for i in range(len(rows))], [len(r.token_ids) for r in rows]))
    shared = {"share_prefixes": True} if share else {}

    def update() -> tuple[float, float]:
        mbs = [collate(rows, advantages, [i for u in g for i in units[u]], 0, **shared)
               for g in pack(lengths, budget)]
        optimizer.zero_grad(set_to_none=True)
        stats = forward_backward(model, mbs, LossConfig(), old_is_current=True)
        norm = clip_grad_norm(model, 1.0)
        optimizer.step()
        return stats.loss, norm

    start = time.perf_counter()
    first = update()  # warm-up (and compilation); the same weights' figures in both runs
    warmup = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        update()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(json.dumps({"wall": wall, "cpu": cpu, "loss": first[0], "grad_norm": first[1],
                      "warmup": warmup, "shared": share,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "agentrl": str(Path(agentrl.__file__).parents[1])}))


def trainer_layout(model_path: Path) -> object:
    """The policy as that checkout's trainer holds it on one CPU rank: through
    ``load_sharded`` in a process group of one (FSDP2-wrapped or plain, as it decides),
    fp32 master weights computing in fp32, per-row attention."""
    import torch

    from agentrl.parallel import groups
    from agentrl.parallel.fsdp import load_sharded
    from agentrl.train.run_parts import read_model_state

    groups.init_process_group(600.0)
    return load_sharded(model_path, read_model_state(model_path), torch.float32,
                        torch.float32, "torch", torch.device("cpu"))


def measure(tree: Path, model_path: Path, args: argparse.Namespace,
            compile_layers: bool = False) -> dict:
    """One worker process on ``tree``'s agentrl."""
    steps, threads = args.steps, args.threads
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, "--worker", str(model_path), "--steps", str(steps),
               "--threads", str(threads), "--budget", str(args.budget)]
    command += ["--compile"] * compile_layers + ["--no-share"] * args.no_share
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["agentrl"]).resolve() != tree.resolve():
        raise RuntimeError(f"the worker imported agentrl from {result['agentrl']}, not {tree}")
    return result


def main() -> None:
    """Alternate the two arms (baseline and this checkout, or eager and compiled),
    ``--rounds`` processes each, per shape."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="checkout to compare against")
    parser.add_argument("--compile", action="store_true",
                        help="compare this checkout eager against model.compile")
    parser.add_argument("--shapes", nargs="+", default=["small"], choices=["small", "large"])
    parser.add_argument("--rounds", type=int, default=3, help="processes per arm")
    parser.add_argument("--steps", type=int, default=4, help="timed updates per process")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=int, default=8192, help="micro-batch tokens")
    parser.add_argument("--no-share", action="store_true",
                        help="every row whole (batch.share_prefixes = false)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.threads, args.compile, args.budget,
               not args.no_share)
        return
    if args.compile and args.baseline:
        parser.error("--compile compares this checkout with itself; drop --baseline")
    from bench.shapes import write_large_checkpoint

    tmp = tempfile.TemporaryDirectory()
    models = {"small": ROOT / "assets" / "quickstart-sft",
              "large": write_large_checkpoint(Path(tmp.name) / "large")}
    arms = ({"eager": (ROOT, False), "compiled": (ROOT, True)} if args.compile
            else {"baseline": (args.baseline, False), "this": (ROOT, False)} if args.baseline
            else {"this": (ROOT, False)})
    print(f"load before: {os.getloadavg()[0]:.2f}; {NUM_GROUPS} groups x {GROUP_SIZE} rows "
          f"({PROMPT_TOKENS} prompt + 10..40 generated tokens), {args.threads} thread(s), "
          f"{args.rounds} x {args.steps} updates per arm")
    for shape in args.shapes:
        runs: dict[str, list[dict]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, (tree, compiled) in arms.items():
                runs[name].append(measure(tree, models[shape], args, compiled))
        medians = {}
        for name, results in runs.items():
            wall = statistics.median(t for r in results for t in r["wall"])
            cpu = statistics.median(t for r in results for t in r["cpu"])
            warmup = statistics.median(r["warmup"] for r in results)
            medians[name] = (wall, cpu)
            rss = max(r.get("peak_rss_mb", 0.0) for r in results)
            print(f"  {shape:<5} {name:<8}: {wall:.3f} s/update wall, {cpu:.3f} s CPU, "
                  f"first update {warmup:.1f} s, peak RSS {rss:.0f} MB, shared prompts "
                  f"{results[0].get('shared', False)} (loss {results[0]['loss']:.6f}, grad "
                  f"norm {results[0]['grad_norm']:.6f})")
        if len(runs) == 2:
            (before, base), (after, this) = ((n, runs[n][0]) for n in runs)
            print(f"  {shape:<5} {after} / {before} speed-up: "
                  f"{medians[before][0] / medians[after][0]:.2f}x wall, "
                  f"{medians[before][1] / medians[after][1]:.2f}x CPU; "
                  f"|d loss| {abs(base['loss'] - this['loss']):.1e}, |d grad norm| "
                  f"{abs(base['grad_norm'] - this['grad_norm']):.1e}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

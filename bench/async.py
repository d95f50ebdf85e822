"""Synchronous vs asynchronous training (rollout.max_staleness = 0, 1, 2), side by side.

    python -m bench.async [--quick] [--steps N] [--repeats R] [--threads T] [--out DIR]
                          [--ks 0,1,2] [--collector process|thread] [--engine-process]

The defaults are the recommended settings for a 2-core machine: one torch thread per side
(``--threads 1``) and the rollout side in a process of its own (``--collector process``).

The earlier quickstart mix (configs/calc_countdown.toml: Calculator with a tool and
compaction, Countdown) plus ``SlowToolCalculator``, whose tool calls take 50 ms like a real API or
sandbox (``bench/slow_tools.py``). Each k trains from the same warm start with the same
seed (k >= 1 with the decoupled objective and the negative-advantage veto at 2, and
carry-over, ``rollout.carry_over``, on as by default; in-flight weight updates off: on
this CPU engine they cost more than they gain, 1.41x against 1.59x), one
after the other in this process. Printed per k: steps per minute and its ratio to the
synchronous loop; the share of wall time the trainer sat idle (waiting for a collection)
and the engine sat idle (nothing to generate: while the trainer trains, in the
synchronous loop; waiting for new enough weights, with k >= 1); the mean staleness of
trained tokens; training reward against cumulative rollouts. From the synchronous run's
phase times G (generate) and T (the rest) it also prints the speed-up bound
(G + T) / max(G, T) that overlapping reaches when engine and trainer have hardware of
their own (on the shared CPU cores of a small machine they compete instead). Then
``agentrl report`` overlays the runs (``DIR/async.png``: reward against rollouts, tokens,
updates and active time).

``--threads 1`` (the default; ``--threads 0`` leaves torch's own count) runs every torch op
single-threaded: on a 2-core machine the synchronous
loop then uses one core while the engine and the trainer of k >= 1 get one core each, a
stand-in for engine and trainer on hardware of their own. ``--collector process`` (the
default; ``thread`` keeps the rollout side in the trainer's process) runs the
k >= 1 collections with ``rollout.collector = "process"``: the engine, environments and
runner in a process of their own, so none of their Python shares the trainer's
interpreter. ``--engine-process`` goes one
step further: every run generates on a fresh ``agentrl serve`` process of its own (one
torch thread, weights pushed over gloo after every step, as with a server on another
machine), so the engine no longer shares the trainer's Python interpreter (its GIL) either.

``--quick``: 8 groups per collection and 8 steps per k (a few minutes on 2 CPU cores);
the default is the quickstart's 16 groups and 30 steps. ``--repeats R`` runs the k in
turn R times (0, 1, 2, 0, 1, 2, ...) and reports the median speed, so that load that
changes over time hits every k alike. Timings on a shared machine are noisy: re-measure
on an idle one.
"""

from __future__ import annotations

import argparse
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.config import config_from_dict
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parent.parent
SLOW_ENV = {"id": "bench.slow_tools:SlowToolCalculator", "name": "slow_calculator",
            "weight": 1.0, "kwargs": {"num_operations": 1, "max_number": 9, "latency_s": 0.05}}


def bench_config(max_staleness: int, steps: int, quick: bool,
                 remote_engines: tuple[str, ...] = (), collector: str = "thread") -> Any:
    """The quickstart config plus the slow-tool environment, validated at start and end;
    generating on ``remote_engines`` (``agentrl serve`` URLs) when given; k >= 1 collects
    on a thread or in a process of its own (``collector``)."""
    raw = bench_raw_config()
    raw["environments"][0]["weight"] = 2.0  # calculator : countdown : slow = 2 : 1 : 1
    raw["environments"].append(SLOW_ENV)
    # one validation before and one after training (32 held-out tasks per environment),
    # so that the report has accuracy points; their time is not counted as training
    raw["train"].update(num_steps=steps, eval_every=steps, eval_tasks_per_env=32,
                        checkpoint_every=0)
    raw["log"]["live"] = False
    raw["rollout"]["max_staleness"] = max_staleness
    if max_staleness > 0:  # the corrections the README recommends for stale data
        raw.setdefault("loss", {}).update(objective="decoupled", negative_advantage_veto=2.0)
        raw["rollout"]["collector"] = collector
    if quick:
        raw["batch"].update(rollout_batch_size=8, global_batch_size=32)
    if remote_engines:
        raw["rollout"].update(remote_engines=list(remote_engines))
    return config_from_dict(raw, source=f"bench k={max_staleness}")


def bench_raw_config() -> dict[str, Any]:
    """The quickstart config with the model path made absolute (what a server serves)."""
    raw = tomllib.loads((ROOT / "configs" / "calc_countdown.toml").read_text())
    raw["model"]["path"] = str(ROOT / raw["model"]["path"])
    return raw


@contextmanager
def engine_process() -> Iterator[tuple[str, ...]]:
    """A fresh ``agentrl serve`` of the quickstart model with one torch thread (its URLs);
    stopped on exit."""
    from agentrl.engines.spawn import spawn_servers

    servers = spawn_servers(ROOT / "configs" / "calc_countdown.toml", 1, threads=1,
                            overrides=(f"model.path={bench_raw_config()['model']['path']}",))
    try:
        yield tuple(server.url for server in servers)
    finally:
        for server in servers:
            server.stop()


def train_once(config: Any, run_dir: Path) -> tuple[float, float]:
    """Train one configuration; (wall-clock seconds of training, CPU seconds this process
    spent inside collections). With the engine in a process of its own, the CPU time of a
    synchronous run's collections is the rollout side's own work (environments, tools,
    chat templates, tokenizer, HTTP), which needs a core of its own to overlap."""
    from agentrl.train.run import build_run
    from agentrl.train.trainer import train

    run = build_run(config, run_dir)
    collect, cpu = run.collect, [0.0]

    def timed_collect(step: int) -> Any:
        start_cpu = time.process_time()
        try:
            return collect(step)
        finally:
            cpu[0] += time.process_time() - start_cpu

    run.collect = timed_collect  # type: ignore[method-assign]
    start = time.perf_counter()
    train(run)
    return time.perf_counter() - start, cpu[0]


def summarize(records: list[dict[str, Any]], wall_s: float, asynchronous: bool,
              collect_cpu_s: float = 0.0) -> dict:
    """Steps per minute, idle shares, staleness and reward figures of one run."""
    if not records:
        raise ValueError("the run wrote no metrics")
    steps = [r for r in records if "reward/mean" in r]
    wall_s -= sum(r.get("time/eval", 0.0) for r in records)  # validations are not training

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in steps))

    if asynchronous:
        engine_idle = total("time/engine_idle")
    else:  # the engine has nothing to do while the trainer trains, syncs and logs
        engine_idle = total("time/train") + total("time/sync") + total("time/other")
    rewards = [r["reward/mean"] for r in steps]
    third = max(1, len(rewards) // 3)
    generate = total("time/generate")
    rest = total("time/train") + total("time/sync") + total("time/other")
    return {
        # what overlapping could give if engine and trainer had hardware of their own:
        # (G + T) / max(G, T) from the phase times (meaningful for the synchronous run)
        "overlap_bound": (generate + rest) / max(generate, rest, 1e-9),
        # the same with the rollout side's CPU work (C) on the trainer's core, as on a
        # 2-core machine with the engine in its own process: (G + T) / (T + C)
        "shared_core_bound": (generate + rest) / max(rest + collect_cpu_s, generate, 1e-9),
        "collect_cpu_per_step": collect_cpu_s / max(len(steps), 1),
        "steps_per_min": len(steps) / wall_s * 60,
        "trainer_idle": total("time/generate") / wall_s,
        "engine_idle": engine_idle / wall_s,
        "staleness": float(np.mean([r.get("staleness/mean", 0.0) for r in steps])),
        "reward_first": float(np.mean(rewards[:third])),
        "reward_last": float(np.mean(rewards[-third:])),
        "accuracy": [r["eval/accuracy"] for r in records if "eval/accuracy" in r],
        "rollouts": [r["cumulative/rollouts"] for r in steps],
        "rewards": rewards,
    }


def print_table(results: dict[int, dict]) -> None:
    """The side-by-side table, ratios against k = 0 (or the first k run)."""
    base = results[min(results)]["steps_per_min"]
    print(f"\n{'k':>2} {'steps/min':>10} {'× sync':>7} {'trainer idle':>13} "
          f"{'engine idle':>12} {'staleness':>10} {'reward 1st⅓':>12} {'reward last⅓':>13} "
          f"{'accuracy':>14}")
    for k, r in sorted(results.items()):
        accuracy = " → ".join(f"{a:.3f}" for a in r["accuracy"])
        print(f"{k:>2} {r['steps_per_min']:10.2f} {r['steps_per_min'] / base:7.2f} "
              f"{r['trainer_idle']:13.1%} {r['engine_idle']:12.1%} {r['staleness']:10.2f} "
              f"{r['reward_first']:12.3f} {r['reward_last']:13.3f} {accuracy:>14}")
    print("\nreward/mean against cumulative rollouts (same rollouts for every k):")
    first = results[min(results)]
    marks = first["rollouts"][max(0, len(first["rollouts"]) // 4 - 1)::max(1, len(
        first["rollouts"]) // 4)]
    print("rollouts " + " ".join(f"{m:>7}" for m in marks))
    for k, r in sorted(results.items()):
        by_rollouts = dict(zip(r["rollouts"], r["rewards"], strict=True))
        print(f"k={k:<6} " + " ".join(f"{by_rollouts.get(m, float('nan')):7.3f}"
                                      for m in marks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 groups, 8 steps per k")
    parser.add_argument("--steps", type=int, default=None, help="steps per k")
    parser.add_argument("--out", default="runs/bench-async", help="folder for the runs")
    parser.add_argument("--ks", default="0,1,2", help="max_staleness values to compare")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over the k; the median round is reported per k")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: the engine and the trainer "
                             "one core each on a 2-core machine, a stand-in for hardware of "
                             "their own; 0: torch's own count)")
    parser.add_argument("--collector", choices=("thread", "process"), default="process",
                        help="rollout.collector of the k >= 1 runs: the rollout side on a "
                             "thread of the trainer's process, or in a process of its own")
    parser.add_argument("--engine-process", action="store_true",
                        help="generate on a fresh `agentrl serve` process per run (one "
                             "thread), not in the trainer's process")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    steps = args.steps or (8 if args.quick else 30)
    out = Path(args.out)
    ks = [int(x) for x in args.ks.split(",")]
    rounds: dict[int, list[dict]] = {k: [] for k in ks}
    for repeat in range(args.repeats):
        for k in ks:
            run_dir = out / (f"k{k}" if repeat == 0 else f"k{k}-r{repeat}")
            serving = engine_process() if args.engine_process else (
                nullcontext(()))
            with serving as urls:
                wall, cpu = train_once(bench_config(k, steps, args.quick, urls,
                                                    args.collector), run_dir)
            rounds[k].append(summarize(read_metrics(run_dir), wall, k > 0, cpu))
            print(f"k={k} round {repeat + 1}: {steps} steps in {wall:.1f} s")
    results = {k: sorted(r, key=lambda x: x["steps_per_min"])[len(r) // 2]
               for k, r in rounds.items()}
    print_table(results)
    if 0 in results:
        print(f"\nsynchronous phase split → speed-up bound with engine and trainer on separate "
              f"hardware: {results[0]['overlap_bound']:.2f}× (on shared CPU cores the two "
              "sides compete, and only the idle time inside generation can be overlapped)")
        if args.engine_process:
            print(f"with the rollout side's own CPU work (environments, tools, templates, "
                  f"HTTP: {results[0]['collect_cpu_per_step']:.2f} s per step) on the "
                  f"trainer's core, as here with 2 cores: bound "
                  f"{results[0]['shared_core_bound']:.2f}×")
    from agentrl.cli import main as cli

    cli(["report", *(str(out / f"k{k}") for k in sorted(results)), "--out",
         str(out / "async.png")])
    print(f"\ncurves: {out / 'async.png'}. Timings on a shared machine are noisy; "
          f"re-measure on an idle one: python -m bench.async{' --quick' if args.quick else ''}")


if __name__ == "__main__":
    main()

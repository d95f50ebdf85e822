"""``agentrl train CONFIG [--set k=v ...] [--out DIR] [--resume]``: run RL training.

With ``train.num_ranks > 1`` the command spawns one process per data-parallel rank
(gloo on CPU, NCCL on GPUs) joined through a file in the run folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

HELP = "Train a policy with RL on the config's environments (metrics, checkpoints, resume)."
STOPPED = 3
"""Exit status when the run stopped itself (``train.max_invalid_fraction``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: config, overrides, output folder, resume."""
    parser.add_argument("config", help="TOML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    parser.add_argument("--out", default=None,
                        help="run folder for metrics.jsonl and checkpoints "
                             "(default: runs/<config name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --out, exactly")


def run(args: argparse.Namespace) -> int:
    """Load the config, train on one or several ranks, and print where everything went."""
    from agentrl.accounting import describe_plan, plan_batches
    from agentrl.config import load_config

    config = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    print(describe_plan(plan_batches(config)))
    num_ranks = config.train.num_ranks
    if num_ranks > 1:
        import torch.multiprocessing as mp

        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as rendezvous:
            init = f"file://{Path(rendezvous).resolve()}/init"
            try:
                mp.spawn(_train_rank, args=(num_ranks, init, config, out, args.resume),
                         nprocs=num_ranks, join=True)
            except mp.ProcessExitedException as exc:
                if exc.exit_code == STOPPED:  # every rank stopped on the same counts
                    return STOPPED
                raise
        return 0
    return _train_rank(0, 1, None, config, out, args.resume)


def _train_rank(rank: int, num_ranks: int, init: str | None, config: Any, out: Path,
                resume: bool) -> int:
    from agentrl import distributed
    from agentrl.rollout.health import RunStopped
    from agentrl.run import build_run
    from agentrl.trainer import train

    group = distributed.init_process_group(rank, num_ranks, init) if num_ranks > 1 else None
    try:
        run_ = build_run(config, out, resume=resume, process_group=group)
        if resume and rank == 0:
            print(f"resuming {out} at step {run_.state.step}")
        state = train(run_)
    except RunStopped as exc:  # an environment is mostly broken: a summary, not a traceback
        if rank == 0:
            print(f"stopped: {exc}", file=sys.stderr)
        if num_ranks > 1:
            raise SystemExit(STOPPED) from None
        return STOPPED
    finally:
        distributed.destroy_process_group()
    if rank == 0:
        print(f"done: {state.step} steps, {state.cumulative_rollouts} rollouts, "
              f"{state.num_updates} updates on {num_ranks} rank(s); metrics in "
              f"{out / 'metrics.jsonl'}, checkpoints in {out / 'checkpoints'}")
    return 0

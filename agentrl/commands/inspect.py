"""``agentrl inspect RUN_DIR | BATCH.json | --demo``: rollouts as text.

- ``RUN_DIR`` (a training run folder): the rollouts training sampled
  (``RUN_DIR/rollouts/step_NNNNNN.jsonl``), decoded turn by turn, with tool calls
  highlighted, compaction boundaries marked, each row's advantage, reward and validity.
  ``--step N`` picks a sampled step (default: the last), ``--env NAME`` one environment.
- ``BATCH.json`` or ``--demo``: a batch as a worked example: each group, its rollouts,
  their rows with token counts, the reward copies, the baseline and the advantage, and the
  counts the token-level loss normalizes by.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("Show rollouts: a run folder's sampled rollouts as decoded turns, or a batch's "
        "rows, reward copies, baselines and advantages.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments: a run folder or a saved batch, or --demo to collect one with the tiny model."""
    parser.add_argument("path", nargs="?", metavar="RUN_DIR | BATCH.json",
                        help="a training run folder, or a batch JSON written by save_batch")
    parser.add_argument("--step", type=int, default=None,
                        help="RUN_DIR: the sampled step to show (default: the last)")
    parser.add_argument("--env", default=None, help="RUN_DIR: only this environment")
    parser.add_argument("--full", action="store_true",
                        help="RUN_DIR: show system messages in full (tool schemas included)")
    parser.add_argument("--demo", action="store_true",
                        help="collect a small batch with compaction using the tiny model")
    parser.add_argument("--save", metavar="PATH", help="with --demo: also write the batch")
    parser.add_argument("--estimator", default="grpo", choices=["grpo", "rloo", "dr_grpo"],
                        help="the advantage estimator the batch is described with "
                             "(default grpo)")
    parser.add_argument("--scale-by-std", action="store_true",
                        help="grpo only: divide advantages by the group's std")


def run(args: argparse.Namespace) -> int:
    """Show a run folder's samples, or load or collect a batch and describe it."""
    if bool(args.path) == bool(args.demo):
        raise ValueError("give a run folder, a batch file or --demo (exactly one)")
    if args.path and Path(args.path).is_dir():
        return show_run(args.path, args.step, args.env, args.full)
    if args.path and not Path(args.path).exists():
        raise ValueError(f"{args.path} does not exist; give a run folder (`agentrl train "
                         "--out DIR`) or a batch JSON (`agentrl inspect --demo --save PATH`)")
    from agentrl.rollout.batch_io import load_batch, save_batch
    from agentrl.rollout.describe import describe_batch

    if args.demo:
        from agentrl.rollout.demo import collect_demo_batch

        rollouts = collect_demo_batch()
        if args.save:
            print(f"saved to {save_batch(args.save, rollouts)}")
    else:
        rollouts = load_batch(args.path)
    print(describe_batch(rollouts, args.estimator, args.scale_by_std))
    return 0


def show_run(run_dir: str, step: int | None, env: str | None, full: bool) -> int:
    """Print one sampled step of a run folder, turn by turn."""
    from rich.console import Console

    from agentrl.transcripts.store import read_records, sampled_steps
    from agentrl.transcripts.terminal import render_records

    steps = sampled_steps(run_dir)
    if not steps:
        raise ValueError(
            f"{run_dir} has no sampled rollouts (no rollouts/step_*.jsonl); training writes "
            "them every log.rollouts_every steps (set it >= 1)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"step {step} has no sampled rollouts in {run_dir}; sampled steps: "
                         f"{_ranges(steps)}")
    records = read_records(run_dir, [step])
    names = sorted({r.env for r in records})
    if env is not None:
        if env not in names:
            raise ValueError(f"no environment {env!r} in step {step}; environments: "
                             f"{', '.join(names)}")
        records = [r for r in records if r.env == env]
    console = Console()
    render_records(records, console, full)
    console.print(f"step {step}: {len(records)} sampled rollouts ({', '.join(names)}); "
                  f"sampled steps {_ranges(steps)}", markup=False, highlight=False)
    return 0


def _ranges(steps: list[int]) -> str:
    """"1-5, 8, 10-12": consecutive steps joined."""
    out: list[str] = []
    start = prev = steps[0]
    for step in [*steps[1:], None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(out)

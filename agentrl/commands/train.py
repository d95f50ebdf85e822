"""``agentrl train CONFIG [--set k=v ...] [--out DIR] [--resume]``: run RL training.

One process trains alone; several ranks, on one machine or many, start through torchrun
(``torchrun --nnodes N --nproc-per-node G -m agentrl train CONFIG``). ``train.num_ranks >
1`` outside torchrun starts that many local ranks through torchrun itself.
"""

from __future__ import annotations

import argparse
import sys
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
                        help="continue from the newest checkpoint in --out: no rollout "
                             "lost or trained twice; bit-exact with train.deterministic "
                             "(docs/resume.md)")
    parser.add_argument("--profile", action="store_true",
                        help="time where each step goes (engine forward, sampling, chat "
                             "template, tokenizer, environment, packing, forward, backward, "
                             "optimizer...): profile/* in metrics.jsonl and a table at the "
                             "end (docs/profiling.md)")
    parser.add_argument("--profile-trace", type=int, default=None, metavar="STEP",
                        help="with --profile: record step STEP with torch.profiler into "
                             "OUT/profile/step_STEP.trace.json (Chrome trace) and .ops.txt")
    parser.add_argument("--checked", action="store_true", help=argparse.SUPPRESS)
    # (--checked: the local launcher already printed the plan and ran the plan-time checks)


def run(args: argparse.Namespace) -> int:
    """Load the config, run the plan-time checks, then train here or start the local ranks
    that will."""
    from agentrl.config import load_config
    from agentrl.config.accounting import describe_plan, plan_batches
    from agentrl.parallel.launch import check_rank_count, launch_local_ranks, needs_local_launch

    config = load_config(args.config, args.overrides)
    check_rank_count(config)
    if args.profile or args.profile_trace is not None:
        from agentrl.observe.profile import PROFILER

        PROFILER.enable(trace_step=args.profile_trace)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    if needs_local_launch(config):
        print(describe_plan(plan_batches(config)))
        _preflight(config, out, args.resume)
        return launch_local_ranks(config.train.num_ranks,
                                  [*_command_line(args, out), "--checked"],
                                  stopped_status=STOPPED)
    state, rank = _train(config, out, args.resume, args.checked)
    if state is None:  # stopped: an environment is mostly broken (summary printed)
        return STOPPED
    if rank == 0:
        print(f"done: {state.step} steps, {state.cumulative_rollouts} rollouts, "
              f"{state.num_updates} updates; metrics in {out / 'metrics.jsonl'}, "
              f"checkpoints in {out / 'checkpoints'}")
    return 0


def _preflight(config: Any, out: Path, resume: bool) -> None:
    """The plan-time checks (refuse before anything is spawned or loaded) and, on resume,
    removal of partial checkpoints left by a killed run."""
    from agentrl.train.preflight import run_checks

    for line in run_checks(config):
        print(line)
    if resume:
        from agentrl.train.checkpoint import remove_stale_temp_folders

        for stale in remove_stale_temp_folders(out):
            print(f"removed {stale}: a partial checkpoint left by a killed run")


def _train(config: Any, out: Path, resume: bool, checked: bool = False) -> tuple[Any, int]:
    """Train on this rank; (the final state or None when stopped, this rank). ``checked``:
    the plan-time checks already ran (in the local launcher)."""
    from agentrl.parallel import groups
    from agentrl.rollout.health import RunStopped

    try:
        return _train_rank(config, out, resume, checked), groups.get_rank()
    except RunStopped as exc:  # an environment is mostly broken: a summary, not a traceback
        if groups.get_rank() == 0:
            print(f"stopped: {exc}", file=sys.stderr)
        return None, groups.get_rank()
    finally:  # no frame holds the run (its model holds the group) any more
        groups.destroy_process_group()


def _train_rank(config: Any, out: Path, resume: bool, checked: bool) -> Any:
    """Join the group, build the run and train it; the final state."""
    from agentrl.config.accounting import describe_plan, plan_batches
    from agentrl.parallel import groups
    from agentrl.parallel.cast import bf16_hint
    from agentrl.parallel.fsdp import is_sharded
    from agentrl.parallel.timeouts import timeouts
    from agentrl.train.run import build_run
    from agentrl.train.trainer import train

    limits = timeouts(config)
    groups.init_process_group(limits.collective_s)
    if not checked:  # rank 0 checks while the others wait outside any collective
        groups.run_on_main("preflight", lambda: _preflight(config, out, resume),
                           limits.wait_for_rank0_s)
    run_ = build_run(config, out, resume=resume)
    if run_.is_main and not checked:
        print(describe_plan(plan_batches(config)))
    if run_.is_main:
        dtype = str(run_.compute_dtype).removeprefix('torch.')
        layout = (f"FSDP2 over {run_.world_size}" if is_sharded(run_.model)
                  else "one rank, not sharded")
        print(f"ranks: {run_.world_size} ({layout}), compute dtype {dtype}, fp32 master "
              "weights")
        hint = bf16_hint(config.model.dtype, run_.compute_dtype, groups.local_device())
        if hint:
            print(hint)
        if run_.token_multiple > 1:
            print(f"micro-batches: padded to multiples of {run_.token_multiple} tokens, so "
                  "their kernel shapes repeat (batch.token_multiple)")
        if config.model.lora is not None:
            from agentrl.model.lora import describe_adapters

            print(describe_adapters(run_.model, config.model.lora, dtype))
        if resume:
            print(f"resuming {out} at step {run_.state.step}")
    return train(run_)


def _command_line(args: argparse.Namespace, out: Path) -> list[str]:
    """This command's own arguments, for the ranks torchrun starts."""
    line = ["train", str(args.config), "--out", str(out)]
    for override in args.overrides:
        line += ["--set", override]
    if args.profile or args.profile_trace is not None:
        line.append("--profile")
    if args.profile_trace is not None:
        line += ["--profile-trace", str(args.profile_trace)]
    return line + (["--resume"] if args.resume else [])

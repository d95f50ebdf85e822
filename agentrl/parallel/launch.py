"""Starting ranks: torchrun is the launcher, on one machine or many.

``torchrun --nnodes N --nproc-per-node G -m agentrl train CONFIG`` starts every rank with
env:// rendezvous variables. ``train.num_ranks > 1`` without torchrun is a shortcut for
``torchrun --standalone --nproc-per-node num_ranks`` on this machine: it calls torchrun's
own entry point, so both go through the same code.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.parallel.groups import launched_by_torchrun


def check_rank_count(config: Config) -> None:
    """Under torchrun, ``train.num_ranks`` must be 1 or torchrun's process count."""
    if not launched_by_torchrun():
        return
    world = int(os.environ["WORLD_SIZE"])
    if config.train.num_ranks not in (1, world):
        raise ConfigError(
            f"train.num_ranks = {config.train.num_ranks} but torchrun started {world} "
            "processes; under torchrun the process count decides: drop train.num_ranks")


def needs_local_launch(config: Config) -> bool:
    """True when this process should start ``train.num_ranks`` local ranks itself."""
    return config.train.num_ranks > 1 and not launched_by_torchrun()


def launch_local_ranks(num_ranks: int, command: list[str], stopped_status: int = 3) -> int:
    """Run ``python -m agentrl COMMAND...`` as ``num_ranks`` ranks on this machine through
    torchrun (standalone rendezvous on a free local port); returns the exit status:
    ``stopped_status`` when the ranks stopped on purpose (their summary is printed)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    threads = max(1, (os.cpu_count() or 1) // num_ranks)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # no oversubscribed cores
    args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(num_ranks), "--no-python",
         sys.executable, "-m", "agentrl", *command])
    try:
        run(args)
    except ChildFailedError as exc:
        if stopped_on_purpose(exc, stopped_status):
            return stopped_status
        print(f"error: a rank failed:\n{exc.format_msg()}", file=sys.stderr)
        return 1
    return 0


def stopped_on_purpose(failure: Any, stopped_status: int) -> bool:
    """True when a rank exited with ``stopped_status`` and every other failed rank did too
    or was ended by torchrun (SIGTERM) because a stopped rank had already left."""
    codes = {f.exitcode for f in failure.failures.values()}
    return stopped_status in codes and codes <= {stopped_status, -signal.SIGTERM}

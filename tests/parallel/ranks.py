"""Spawning N local ranks for a test, each set up exactly as torchrun sets up a rank."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from agentrl.engines.collective import free_port


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from agentrl.parallel import groups

    groups.destroy_process_group()  # a forked copy of the parent's group of one
    groups.init_process_group(timeout_s=120)
    try:
        fn(rank, *args)
    finally:
        groups.destroy_process_group()


def spawn_ranks(world: int, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(rank, *args)`` in ``world`` processes joined in one gloo process group.

    Forked, not spawned: the children inherit the imported modules (seconds per rank on
    this machine), and the parent has not started a process group or threads of its own
    that a fork could copy mid-use."""
    from agentrl.parallel import groups

    # A group of one left by an earlier in-process run would be copied into every child,
    # where leaving it can wait forever on gloo threads the fork did not copy.
    groups.destroy_process_group()
    mp.start_processes(_rank_main, args=(world, free_port(), fn, args), nprocs=world,
                       join=True, start_method="fork")

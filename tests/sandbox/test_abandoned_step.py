"""A ``Python-v0`` step abandoned at its deadline stops every sandbox it started: the one
running is killed and the step's remaining tool calls start none (issue 41: for about 60 s
after the collection returned, new sandbox processes kept starting)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentrl.envs.registry import make
from agentrl.rollout.env_contract import EnvError
from agentrl.rollout.env_thread_caller import ThreadCaller
from agentrl.sandbox import bwrap_problem

pytestmark = pytest.mark.filterwarnings("ignore:isolation = \"process\"")


def children() -> set[int]:
    """Live (not zombie) child processes of this process."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.add(int(entry))
    return found


def test_an_abandoned_step_stops_every_sandbox_it_started() -> None:
    isolation = "bwrap" if bwrap_problem() is None else "process"
    env = make("agentrl/Python-v0", wall_s=4.0, isolation=isolation)
    env.reset(seed=0)
    call = {"name": "run_python", "arguments": {"code": "import time; time.sleep(3)"}}
    action = f"<tool_call>{json.dumps(call)}</tool_call>" * 4  # 4 x 3 s of sandbox
    before = children()
    caller = ThreadCaller("python", env)

    async def play() -> None:
        with pytest.raises(EnvError) as failure:
            await caller.call("step", (action,), {}, 1.0)
        assert failure.value.kind == "step_timeout"

    asyncio.run(play())
    time.sleep(1.0)  # the running sandbox is being killed
    seen: set[int] = set()
    for _ in range(70):  # 7 s: the three calls left would start in this time
        seen |= children() - before
        time.sleep(0.1)
    assert not seen, f"the abandoned step kept {len(seen)} sandbox processes going"

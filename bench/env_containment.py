"""Step deadlines under load: queueing, and a step that holds the GIL.

    python bench/env_containment.py [--rollouts 64] [--tool-s 0.2]

1. Queueing: ``--rollouts`` concurrent rollouts whose tool call sleeps ``--tool-s``
   seconds, ``rollout.step_timeout_s = 1``: how many rollouts were invalidated. With
   asyncio's default pool (a few threads) the steps queued and the queue time counted
   against the deadline.
2. A step holding the GIL: a group of 2 rollouts whose step runs a backtracking regex
   for about 3 s (C code, the GIL held throughout) next to a group of 2 quick rollouts,
   with ``rollout.step_timeout_s = 0.5``, in thread isolation and (where supported) in
   process isolation (twice: the first also starts the forkserver): the collection's
   wall time and what became of the rollouts.

Uses only the runner's public API, so it runs on any commit. Timings are wall-clock on a
shared machine: noisy; compare the two isolations measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from agentrl.config import config_from_dict
from agentrl.engines.interface import Generation
from agentrl.envs import AgentEnv, Grade, Task
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Message

HERE = Path(__file__).resolve()
GIL_INPUT_LENGTH = 25  # (a+)+$ on "a" * n + "b": about 3 s here, doubling per +1


class FixedEngine:
    """Replies "go" (a few token ids) at once; stands in for a model."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer.encode("go") + [tokenizer.eos_token_id]

    async def generate(self, prompt_ids, params) -> Generation:
        await asyncio.sleep(0)
        return Generation(list(self.ids), [-0.1] * len(self.ids), "stop")


class SleepyToolEnv(AgentEnv):
    """Two steps; the first sleeps like a tool call, the second answers."""

    tool_s = 0.2

    def sample_task(self, rng: np.random.Generator) -> Task:
        n = int(rng.integers(1_000_000))
        return Task([Message("user", f"task {n}")], answer=n, key=str(n))

    def step(self, action: str):
        if self._turn == 0:
            self._turn = 1
            time.sleep(self.tool_s)
            return [Message("tool", "done", "tool")], 0.0, False, False, {}
        return [], 1.0, True, False, {}

    def grade(self, answer: str) -> Grade:
        return Grade(1.0)


class QuickEnv(SleepyToolEnv):
    """One quick step."""

    def step(self, action: str):
        return [], 1.0, True, False, {}


class GilHogEnv(SleepyToolEnv):
    """One step running a regex that holds the GIL for seconds."""

    def step(self, action: str):
        re.match(r"(a+)+$", "a" * GIL_INPUT_LENGTH + "b")
        return [], 1.0, True, False, {}


class GilHogProcessEnv(GilHogEnv):
    """The same, run in a worker process (ignored by commits without isolation)."""

    isolation = "process"


def config(env_ids: list[str], groups: int, size: int, timeout_s: float):
    return config_from_dict({
        "environments": [{"id": env_id, "name": f"env{i}"} for i, env_id in enumerate(env_ids)],
        "batch": {"rollout_batch_size": groups, "n_samples_per_prompt": size,
                  "global_batch_size": groups * size},
        "rollout": {"max_new_tokens": 4, "max_turns": 3, "step_timeout_s": timeout_s,
                    "max_concurrent_rollouts": groups * size},
    })


def collect(tokenizer, cfg, make_env=None) -> tuple[float, list]:
    """Seconds and rollouts of one collection."""
    kwargs = {"make_env": make_env} if make_env is not None else {}
    names = {e.display_name(): 1.0 for e in cfg.environments}
    runner = RolloutRunner(cfg, FixedEngine(tokenizer), tokenizer,
                           EnvironmentSampler(names, 0), **kwargs)
    start = time.perf_counter()
    result = asyncio.run(runner.collect(0, cfg.batch.global_batch_size))
    return time.perf_counter() - start, result.rollouts


def queueing(tokenizer, rollouts: int, tool_s: float) -> None:
    SleepyToolEnv.tool_s = tool_s
    cfg = config(["bench"], rollouts // 4, 4, timeout_s=1.0)
    seconds, done = collect(tokenizer, cfg, make_env=lambda _: SleepyToolEnv())
    invalid = sum(not r.valid for r in done)
    print(f"queueing: {rollouts} rollouts x {tool_s:g} s tool, step_timeout_s 1: "
          f"{invalid} invalid, collection {seconds:.2f} s")


def gil(tokenizer) -> None:
    start = time.perf_counter()
    re.match(r"(a+)+$", "a" * GIL_INPUT_LENGTH + "b")
    print(f"the regex alone holds the GIL for {time.perf_counter() - start:.2f} s")
    for cls in ("GilHogEnv", "GilHogProcessEnv", "GilHogProcessEnv"):
        cfg = config([f"{HERE}:{cls}", f"{HERE}:QuickEnv"], 2, 2, timeout_s=0.5)
        seconds, done = collect(tokenizer, cfg)
        errors = sorted({r.stats.error for r in done if not r.valid})
        print(f"{cls}: collection {seconds:.2f} s, {sum(not r.valid for r in done)} of "
              f"{len(done)} invalid: {errors[:1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--tool-s", type=float, default=0.2)
    args = parser.parse_args()
    # imported here, not at the top: process-isolated workers import this main module
    from agentrl.model import build_tiny_checkpoint, load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(build_tiny_checkpoint(Path(tmp) / "m", vocab_size=300))
    queueing(tokenizer, args.rollouts, args.tool_s)
    gil(tokenizer)


if __name__ == "__main__":
    main()

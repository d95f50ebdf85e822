"""Sampled rollouts on disk: which rollouts a step keeps, writing them, reading them back.

Every ``log.rollouts_every`` steps, rank 0 writes ``RUN_DIR/rollouts/step_NNNNNN.jsonl``:
one :class:`RolloutRecord` per line, per environment the best rollout (highest reward),
the worst (lowest) and ``log.rollouts_random_per_env`` others drawn at random, seeded by
the run's seed and the step (the same run samples the same rollouts). One file per step
keeps ``--step N`` a single read and lets a resumed run drop the steps it redoes.

Cost: only the kept rollouts are decoded (a few per environment), so writing takes
milliseconds per step; the trainer logs it as ``time/rollout_sample`` and
``log/rollout_sample_bytes``.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agentrl.transcripts.record import RolloutRecord, build_record
from agentrl.types import Rollout, Row

SAMPLES_DIR = "rollouts"
_FILE = re.compile(r"step_(\d+)\.jsonl$")


def sample_path(run_dir: str | Path, step: int) -> Path:
    """Where a step's sampled rollouts live."""
    return Path(run_dir) / SAMPLES_DIR / f"step_{step:06d}.jsonl"


def choose(rollouts: Sequence[Rollout], num_random: int, seed: int,
           step: int) -> list[tuple[Rollout, str]]:
    """Per environment (in name order): the best, the worst, then ``num_random`` of the
    rest at random; each with why it was chosen. Ties go to the earlier rollout."""
    by_env: dict[str, list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        by_env[rollout.env].append(rollout)
    rng = np.random.default_rng([seed, step])
    chosen: list[tuple[Rollout, str]] = []
    for env in sorted(by_env):
        members = by_env[env]
        rewards = [r.reward for r in members]
        best = int(np.argmax(rewards))
        rest = [i for i in range(len(members)) if i != best]
        picks = [(best, "best")]
        if rest:
            worst = min(rest, key=lambda i: rewards[i])
            picks.append((worst, "worst"))
            rest.remove(worst)
        if rest and num_random > 0:
            drawn = rng.choice(len(rest), size=min(num_random, len(rest)), replace=False)
            picks.extend((rest[int(k)], "random") for k in sorted(drawn))
        chosen.extend((members[i], why) for i, why in picks)
    return chosen


class RolloutSampleWriter:
    """Writes each sampled step's transcripts; lives on rank 0 only."""

    def __init__(self, run_dir: str | Path, tokenizer: Any, every: int, num_random: int,
                 seed: int, resume_step: int | None = None) -> None:
        """Clear samples a fresh run would otherwise mix with (all of them), or on resume
        those of steps after ``resume_step`` (they are trained again)."""
        self.run_dir = Path(run_dir)
        self.tokenizer = tokenizer
        self.every = every
        self.num_random = num_random
        self.seed = seed
        for step in sampled_steps(self.run_dir):
            if resume_step is None or step > resume_step:
                sample_path(self.run_dir, step).unlink()

    def due(self, step: int) -> bool:
        """Whether this step's rollouts are sampled."""
        return self.every > 0 and step % self.every == 0

    def write(self, step: int, rollouts: Sequence[Rollout], rows: Sequence[Row],
              advantages: Sequence[float]) -> dict[str, float]:
        """Write the step's sample when it is due; returns its cost as metrics.

        ``advantages[i]`` is the trainer's advantage of ``rows[i]``.
        """
        if not self.due(step):
            return {}
        start = time.perf_counter()
        by_row = {(row.rollout_id, row.segment): adv
                  for row, adv in zip(rows, advantages, strict=True)}
        encoder = msgspec.json.Encoder()
        lines = []
        for rollout, why in choose(rollouts, self.num_random, self.seed, step):
            trained = {i: by_row[(rollout.rollout_id, i)] for i in range(len(rollout.segments))
                       if (rollout.rollout_id, i) in by_row}
            record = build_record(rollout, trained, self.tokenizer, step, why)
            lines.append(encoder.encode(record) + b"\n")
        path = sample_path(self.run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(lines)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return {"time/rollout_sample": time.perf_counter() - start,
                "log/rollout_sample_bytes": float(len(data))}


def sampled_steps(run_dir: str | Path) -> list[int]:
    """Steps that have a sample file, ascending."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _FILE.search(p.name)))


def read_step(run_dir: str | Path, step: int) -> list[RolloutRecord]:
    """The records of one sampled step (a line cut short by a crash ends the file)."""
    decoder = msgspec.json.Decoder(RolloutRecord)
    records = []
    for line in sample_path(run_dir, step).read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except msgspec.DecodeError:
            break
    return records


def read_records(run_dir: str | Path, steps: Sequence[int] | None = None,
                 env: str | None = None) -> list[RolloutRecord]:
    """Sampled records of the given steps (all when None), optionally of one environment."""
    available = sampled_steps(run_dir)
    wanted = available if steps is None else [s for s in steps if s in available]
    records = [r for step in wanted for r in read_step(run_dir, step)]
    return [r for r in records if env is None or r.env == env]

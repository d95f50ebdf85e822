"""The GPU acceptance run's resume and rank-0 wait checks (``bench/gpu_acceptance.py``).

After the built-in engine's 3-step run (``train.deterministic``, checkpoints at steps 2
and 3), a copy of its run folder loses ``step_3`` and is resumed with ``--resume`` to
step 4: the resume must start from step 2, redo step 3 and go on, its metrics continuing
(every step once, the counters as an uninterrupted run's), and the redone step 3 must
equal the uninterrupted one (``RESUME_TOLERANCE``; bit-exact is what
``train.deterministic`` promises, docs/resume.md).

With two or more ranks the resumed run also plays ``bench.slow_env.SlowCountdown`` in
place of Countdown, under a short ``train.collective_timeout_s``: each collection on
rank 0 then takes longer than any collective may, so the run exits 0 only if ranks 1..N
wait for rank 0 outside any collective (``groups.wait_for_main``, the README's "rank-0
wait").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench.gpu_acceptance import failure

RESUMED_STEPS = 4
"""The resumed run goes on to this step (redoing step 3, then one new step)."""
RESUME_TOLERANCE = 1e-6
"""Relative difference (to max(1, |value|)) allowed between the redone step 3's metrics
and the uninterrupted step 3's; integers (tokens, counts) must be equal. The promise is
bit-exact, so any difference beyond rounding in printing is a FAIL."""
WAIT = {True: (6.0, 8.0), False: (15.0, 20.0)}
"""By dry run: (train.collective_timeout_s, seconds each SlowCountdown step waits). On
GPUs the collective timeout must still cover NCCL's start-up and real collectives; the
wait stays under rollout.step_timeout_s (30 s by default)."""
TIMED = ("time/", "perf/", "memory/", "profile/", "replica/", "eval/")
"""Metrics that depend on timing, the device or the validation schedule, not the step."""


def rank0_wait_overrides(machine: Any) -> list[str]:
    """The resumed run's settings for the rank-0 wait check ([] on one rank: no wait)."""
    if machine.num_ranks < 2:
        return []
    timeout, latency = WAIT[machine.dry_run]
    return [f"train.collective_timeout_s={timeout}",
            'environments.1.id="bench.slow_env:SlowCountdown"',
            f"environments.1.kwargs={{ num_numbers = 2, max_number = 9, latency_s = {latency} }}"]


def check_resume(report: Any, machine: Any, out: Path, steps: list[dict[str, Any]],
                 train: Any) -> None:
    """Resume a copy of the finished run ``out`` (whose step records are ``steps``) from
    step 2 and record the resume and rank-0 wait checks; ``train`` runs torchrun
    (``gpu_acceptance.train``)."""
    tag = "[resume]"
    wait = rank0_wait_overrides(machine)
    if not steps or not (out / "checkpoints" / "step_2").is_dir():
        report.check(f"{tag} --resume from step_2", False, "the built-in engine's run "
                     "failed or wrote no step_2 checkpoint: nothing to resume")
        _wait_check(report, machine, None, [], wait)
        return
    resumed = out.parent / f"{out.name}-resumed"
    shutil.rmtree(resumed, ignore_errors=True)
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")  # as if killed before step 3's
    status, log, records = train(machine, "torch", resumed,
                                 [f"train.num_steps={RESUMED_STEPS}", "train.eval_every=0",
                                  *wait], resume=True)
    report.check(f"{tag} --resume from step_2 to step {RESUMED_STEPS} exits 0", status == 0,
                 "" if status == 0 else failure(log))
    if status == 0:
        after = [r for r in records if r.get("step", 0) > 0 and "loss/policy_loss" in r]
        said = "at step 2" in log
        report.check(f"{tag} starts at the newest checkpoint, step 2", said,
                     "" if said else "the run did not say 'resuming ... at step 2'")
        _continuation_checks(report, tag, steps, after)
    _wait_check(report, machine, status, records, wait)


def _continuation_checks(report: Any, tag: str, before: list[dict[str, Any]],
                         after: list[dict[str, Any]]) -> None:
    numbers = [r["step"] for r in after]
    report.check(f"{tag} every step once, the lost step 3 redone",
                 numbers == list(range(1, RESUMED_STEPS + 1)), f"steps {numbers}")
    if len(before) < 3 or len(after) < RESUMED_STEPS:
        report.check(f"{tag} counters continue", False,
                     f"{len(before)} steps before, {len(after)} after the resume")
        report.check(f"{tag} redone step 3 equals the uninterrupted step 3", False,
                     "no step 3 to compare")
        return
    per_step = [before[i]["cumulative/rollouts"] - before[i - 1]["cumulative/rollouts"]
                for i in (1, 2)]
    grew = after[3]["cumulative/rollouts"] - after[2]["cumulative/rollouts"]
    updates = [r.get("cumulative/updates") for r in after]
    report.check(f"{tag} counters continue",
                 grew == per_step[0] == per_step[1] and updates == [2, 4, 6, 8]
                 and after[2]["cumulative/tokens"] == before[2]["cumulative/tokens"]
                 and after[3]["cumulative/tokens"] > after[2]["cumulative/tokens"],
                 f"rollouts per step {per_step} then {grew}, updates {updates}, tokens at "
                 f"step 3 {before[2]['cumulative/tokens']} vs {after[2]['cumulative/tokens']}")
    differ = metric_differences(before[2], after[2])
    report.check(f"{tag} redone step 3 equals the uninterrupted step 3 (rel. "
                 f"{RESUME_TOLERANCE:g})", not differ,
                 "; ".join(differ[:5]) if differ else
                 f"{len(comparable(before[2]))} metrics equal")


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A step's metrics that do not depend on timing or the device (see ``TIMED``)."""
    return {k: v for k, v in record.items() if isinstance(v, int | float)
            and not k.startswith(TIMED) and not k.endswith(("_s", "tokens_per_s"))
            and not _priced_time(k)}


def _priced_time(key: str) -> bool:
    """A cost figure made of wall-clock seconds (agentrl.observe.costs): the seconds
    themselves, and the money figures that price them."""
    return key.endswith(("_seconds", "cost/step", "cost/per_reward_point", "cumulative/cost"))


def metric_differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Each comparable metric of ``want`` that ``got`` lacks or differs in."""
    out = []
    for name, value in comparable(want).items():
        other = got.get(name)
        if not isinstance(other, int | float):
            out.append(f"{name} missing after the resume")
        elif isinstance(value, int) and isinstance(other, int):
            if value != other:
                out.append(f"{name} {value} vs {other}")
        elif abs(value - other) > RESUME_TOLERANCE * max(1.0, abs(value)):
            out.append(f"{name} {value:.9g} vs {other:.9g}")
    return out


def _wait_check(report: Any, machine: Any, status: int | None,
                records: list[dict[str, Any]], wait: list[str]) -> None:
    name = "[rank-0 wait] ranks 1..N wait outside any collective longer than it may take"
    if not wait:
        report.skip(name, f"{machine.num_ranks} training rank: no other rank waits")
        return
    timeout, _ = WAIT[machine.dry_run]
    if status != 0:
        report.check(name, False, "the resumed run (slow collections on rank 0) did not "
                     "finish; see the [resume] lines")
        return
    solo = [r["time/generate"] for r in records if r.get("step", 0) > 2
            and "time/generate" in r]
    report.check(name, bool(solo) and max(solo) > timeout,
                 f"rank 0 collected for up to {max(solo):.1f} s, collective timeout "
                 f"{timeout:g} s" if solo else "time/generate missing from the resumed steps")

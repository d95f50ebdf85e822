"""The acceptance run's resume and rank-0 wait checks can each fail (bench/acceptance_resume.py),
judged on crafted runs: no torchrun here, the dry run covers the real one."""

from __future__ import annotations

import pytest

from bench.acceptance_resume import WAIT, check_resume, comparable, metric_differences
from bench.gpu_acceptance import Machine, Report

TIMEOUT, LATENCY = WAIT[False]


def _step(step: int, **extra) -> dict:
    return {"step": step, "loss/policy_loss": 0.125 * step, "loss/kl_loss": 0.01,
            "cumulative/updates": 2 * step, "cumulative/rollouts": 64 * step,
            "cumulative/tokens": 1000 * step, "num_sampled_tokens": 1000,
            "time/generate": LATENCY + 1.0, "cumulative/active_s": 3.0 * step, **extra}


BEFORE = [_step(s) for s in (1, 2, 3)]
GOOD = [_step(s) for s in (1, 2, 3, 4)]
LOG = "resuming /x at step 2\n"


def _verdicts(tmp_path, status=0, log=LOG, records=GOOD, ranks=4, before=BEFORE):
    out = tmp_path / "torch"
    for step in (2, 3):
        (out / "checkpoints" / f"step_{step}").mkdir(parents=True, exist_ok=True)
    seen = {}

    def train(machine, engine, folder, extra, resume):
        seen.update(folder=folder, extra=extra, resume=resume)
        return status, log, records

    report = Report()
    check_resume(report, Machine(False, ranks, "H100"), out, before, train)
    return {c.name.split(" (rel.")[0]: c.status for c in report.checks}, seen


def test_a_good_resume_passes_and_resumes_a_copy_without_step_3(tmp_path) -> None:
    verdicts, seen = _verdicts(tmp_path)
    assert set(verdicts.values()) == {"PASS"} and len(verdicts) == 6, verdicts
    assert seen["resume"] and not (seen["folder"] / "checkpoints" / "step_3").exists()
    assert (seen["folder"] / "checkpoints" / "step_2").is_dir()
    assert f"train.collective_timeout_s={TIMEOUT}" in seen["extra"]
    assert (tmp_path / "torch" / "checkpoints" / "step_3").is_dir()  # the original kept


@pytest.mark.parametrize("case, records, failing", [
    ("a step twice", [*GOOD[:3], GOOD[2], GOOD[3]], "every step once, the lost step 3 redone"),
    ("a step lost", [*GOOD[:2], GOOD[3]], "counters continue"),
    ("counters restart", [*GOOD[:3], _step(4, **{"cumulative/updates": 2})],
     "counters continue"),
    ("another loss", [*GOOD[:2], _step(3, **{"loss/policy_loss": 0.376}), GOOD[3]],
     "redone step 3 equals the uninterrupted step 3"),
    ("a metric missing", [*GOOD[:2], {k: v for k, v in GOOD[2].items() if k != "loss/kl_loss"},
                          GOOD[3]], "redone step 3 equals the uninterrupted step 3"),
    ("fast collections", [*GOOD[:2], *(_step(s, **{"time/generate": TIMEOUT - 1}) for s in (3, 4))],
     "ranks 1..N wait outside any collective longer than it may take"),
    ("no collection time", [*GOOD[:2], *({k: v for k, v in _step(s).items()
                                          if k != "time/generate"} for s in (3, 4))],
     "ranks 1..N wait outside any collective longer than it may take"),
])
def test_each_resume_check_can_fail(tmp_path, case, records, failing) -> None:
    verdicts, _ = _verdicts(tmp_path, records=records)
    assert any(failing in name and status == "FAIL" for name, status in verdicts.items()), (
        case, verdicts)


def test_a_failed_or_silent_resume_fails_and_one_rank_skips_the_wait(tmp_path) -> None:
    failed, _ = _verdicts(tmp_path, status=1, log="Traceback ...")
    assert list(failed.values()) == ["FAIL", "FAIL"]  # the run, and the wait it proves
    silent, _ = _verdicts(tmp_path, log="started afresh\n")
    assert silent["[resume] starts at the newest checkpoint, step 2"] == "FAIL"
    nothing, _ = _verdicts(tmp_path, before=[])
    assert set(nothing.values()) == {"FAIL"}
    one, seen = _verdicts(tmp_path, ranks=1)
    wait = [s for n, s in one.items() if n.startswith("[rank-0 wait]")]
    assert wait == ["SKIP"] and not any("collective_timeout" in e for e in seen["extra"])


def test_metric_differences_ignore_timing_but_not_counts() -> None:
    base = _step(3)
    assert metric_differences(base, {**base, "time/generate": 99.0,
                                     "cumulative/active_s": 1.0}) == []
    assert metric_differences(base, {**base, "num_sampled_tokens": 1001}) == [
        "num_sampled_tokens 1000 vs 1001"]
    assert metric_differences(base, {**base, "loss/kl_loss": 0.01 + 1e-9}) == []


def test_wall_clock_cost_figures_are_not_compared_and_token_counts_are():
    record = {"cost/generation_seconds": 0.7, "env/a/cost/env_seconds": 64.1,
              "env/a/cost/step": 0.3, "cost/per_reward_point": 0.1, "cumulative/cost": 2.0,
              "cost/generated_tokens": 120, "env/a/cost/prompt_tokens": 900,
              "reward/mean": 0.5}
    assert comparable(record) == {"cost/generated_tokens": 120,
                                  "env/a/cost/prompt_tokens": 900, "reward/mean": 0.5}

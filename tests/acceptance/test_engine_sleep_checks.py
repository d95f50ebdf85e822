"""The acceptance run's sleep → weights → wake checks (bench/engine_scaling.py) can fail:
a sync that wakes a replica whole, a KV cache back before the generation, sleep that frees
nothing."""

from __future__ import annotations

from bench.engine_scaling import SleepProbe, _sleep_checks
from bench.gpu_acceptance import Report

GIB = 2**30


class Replica:
    def wake_up(self, tags=None) -> None:
        pass


def _verdicts(wakes, moments, asleep=True, gpu=False) -> dict[str, str]:
    replica = Replica()
    probe = SleepProbe([replica], (lambda: asleep) if not gpu else None,
                       (lambda: 0) if gpu else None)
    for tags in wakes:
        replica.wake_up(tags)  # recorded through the probe
    report = Report()
    _sleep_checks(report, "r", probe, moments, num_replicas=1)
    return {c.name.removeprefix("r: "): c.status for c in report.checks}


ORDER = [["weights"], None, ["weights"], None]
CPU = [{"asleep": True, "still_asleep": True}] * 2
GPU = [{"awake": 10 * GIB, "slept": 40 * GIB, "synced": 39 * GIB, "woken": 9 * GIB}] * 2


def test_sleep_weights_wake_in_that_order_passes() -> None:
    assert _verdicts(ORDER, CPU) == {
        "the sync wakes only the weights, the generation the rest": "PASS",
        "the KV cache stays freed through the sync": "PASS",
        "sleep frees GPU memory, the sync takes back the weights alone": "SKIP"}
    assert set(_verdicts(ORDER, GPU, gpu=True).values()) == {"PASS"}


def test_each_sleep_check_can_fail() -> None:
    woke_whole = [None, ["weights"], None, ["weights"]]  # awake before the sync
    assert _verdicts(woke_whole, CPU)[
        "the sync wakes only the weights, the generation the rest"] == "FAIL"
    assert _verdicts(ORDER[:2], CPU)[  # the second sync never slept
        "the sync wakes only the weights, the generation the rest"] == "FAIL"
    woken_early = [{"asleep": True, "still_asleep": False}] * 2
    assert _verdicts(ORDER, woken_early)["the KV cache stays freed through the sync"] == "FAIL"
    kv_back = [{**GPU[0], "synced": 9 * GIB}] * 2  # the sync took the KV cache back
    nothing_freed = [{**GPU[0], "slept": 10 * GIB}] * 2
    name = "sleep frees GPU memory, the sync takes back the weights alone"
    assert _verdicts(ORDER, kv_back, gpu=True)[name] == "FAIL"
    assert _verdicts(ORDER, nothing_freed, gpu=True)[name] == "FAIL"

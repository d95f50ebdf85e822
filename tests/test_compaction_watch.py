"""Compaction never dies silently: when an environment's compact calls per rollout fall by
more than half from its first steps, the run warns once and ``agentrl report`` marks it.

The rule (``agentrl.observe.compaction.compaction_decline``): the first window is the 3
steps from the first with any compact call, the latest window the last 3 steps after it;
a decline when the first averages >= 0.1 calls and the latest < half of it."""

from __future__ import annotations

import json
import warnings

import pytest

from agentrl.cli import main
from agentrl.commands.report import build_figure
from agentrl.observe.compaction import (
    CompactionDeclineWarning,
    CompactionWatch,
    compaction_decline,
    run_declines,
)

ISSUE_40 = [0.50, 0.41, 0.34, 0.27, 0.16, 0.05, 0.03, 0.0, 0.0, 0.0]
"""Compact calls per rollout of the page environment in issue 40, steps 1-10."""


def points(calls: list[float], first_step: int = 1) -> list[tuple[int, float]]:
    return [(first_step + i, c) for i, c in enumerate(calls)]


def first_decline(env: str, calls: list[float]):
    """The decline the rule sees first when the steps arrive one at a time."""
    for end in range(1, len(calls) + 1):
        decline = compaction_decline(env, points(calls[:end]))
        if decline is not None:
            return decline
    return None


def test_the_issue_40_run_is_caught_at_step_6_worked_by_hand():
    decline = first_decline("pages", ISSUE_40)
    # first window steps 1-3: (0.50 + 0.41 + 0.34) / 3 = 0.4167; half of it 0.2083.
    # steps 2-4 (0.34) would overlap it; steps 4-6: (0.27 + 0.16 + 0.05) / 3 = 0.16 < 0.2083
    assert decline is not None and decline.env == "pages"
    assert decline.first_steps == (1, 3) and decline.last_steps == (4, 6)
    assert decline.first_mean == pytest.approx(1.25 / 3)
    assert decline.last_mean == pytest.approx(0.16)
    text = decline.message()
    assert "'pages'" in text and "0.42" in text and "0.16" in text and "steps 4-6" in text


@pytest.mark.parametrize("calls", [
    [0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.2],  # exactly half: not "more than half"
    [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],  # rising
    [0.05, 0.05, 0.05, 0.0, 0.0, 0.0],  # never really compacted (< 0.1 per rollout)
    [0.0] * 8,  # never compacted
    [0.9, 0.9, 0.9, 0.0, 0.0],  # not yet two windows without overlap
])
def test_no_decline(calls):
    assert first_decline("e", calls) is None


def test_the_first_window_starts_at_the_first_compact_call():
    calls = [0.0, 0.0, 0.3, 0.3, 0.3, 0.1, 0.1, 0.1]
    decline = first_decline("e", calls)
    assert decline is not None
    assert decline.first_steps == (3, 5) and decline.last_steps == (6, 8)
    assert first_decline("e", calls[:7]) is None  # steps 5-7 overlap the first window


def metrics_of(step: int, **calls: float) -> dict:
    record = {"step": step, "compaction/by_tool/mean": sum(calls.values())}
    record.update({f"env/{env}/compaction/by_tool/mean": c for env, c in calls.items()})
    return record


def issue_run() -> list[dict]:
    """The dying environment beside one whose compaction holds."""
    return [metrics_of(step, pages=c, ledger=0.9) for step, c in
            enumerate(ISSUE_40, start=1)]


def test_the_run_warns_once_naming_the_environment():
    watch = CompactionWatch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for record in issue_run():
            watch.warn(record)
    messages = [str(w.message) for w in caught if w.category is CompactionDeclineWarning]
    assert len(messages) == 1  # at step 6, never again
    assert "'pages'" in messages[0] and "0.42" in messages[0] and "0.16" in messages[0]
    assert list(watch.declines) == ["pages"]  # ledger's 0.9 throughout: no decline


def test_an_environment_sampled_on_some_steps_only_is_judged_on_its_own_steps():
    records = [metrics_of(step, pages=c) if step % 2 else {"step": step}
               for step, c in enumerate([0.6, 0, 0.6, 0, 0.6, 0, 0.1, 0, 0.1, 0, 0.1],
                                        start=1)]
    (decline,) = run_declines(records)[1]
    assert decline.first_steps == (1, 5) and decline.last_steps == (7, 11)


def test_a_resumed_run_warns_no_decline_twice():
    """The trainer starts its watch from the run's metrics up to the resumed step."""
    records = issue_run()
    watch, seen = run_declines(records, up_to_step=7)
    assert [d.env for d in seen] == ["pages"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for record in records[7:]:
            watch.warn(record)
    assert not [w for w in caught if w.category is CompactionDeclineWarning]
    watch, seen = run_declines(records, up_to_step=5)  # resumed before the decline
    assert seen == []
    with pytest.warns(CompactionDeclineWarning, match="'pages'.*steps 4-6"):
        watch.warn(records[5])


def test_report_marks_the_decline(tmp_path, capsys):
    run_dir = tmp_path / "dying"
    run_dir.mkdir()
    records = [{**r, "reward/mean": 0.1, "cumulative/rollouts": 8 * r["step"]}
               for r in issue_run()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "report.png"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "! compaction is dying in environment 'pages'" in printed
    assert "'ledger'" not in printed and out.exists()
    figure = build_figure({"dying": records}, "eval/accuracy", None)
    spans = [p for ax in figure.axes for p in ax.patches
             if p.get_label() == "compaction dying: pages"]
    assert len(spans) == 1

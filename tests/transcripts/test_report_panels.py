"""`agentrl report`: agent-side panels per environment, no empty axes, a legend on every
axis with lines; checked on the matplotlib figure objects of a real run's metrics."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from agentrl.cli import main
from agentrl.commands.report import build_figure
from agentrl.observe.panels import agent_panels, all_keys
from agentrl.observe.writers import read_metrics

AGENT_TITLES = ["compactions per rollout", "compactions forced by the budget per rollout",
                "share of rollouts that compacted", "reward of rollouts that compacted",
                "reward of rollouts that did not compact", "rows per rollout",
                "turns per rollout", "truncated share of rollouts", "invalid share of rollouts",
                "generated tokens per trained rollout",
                "generated tokens per generated rollout", "tool errors by kind"]

COST_TITLES = ["engine seconds per step (share of busy time)", "environment seconds per step",
               "generated tokens per step", "prompt tokens per step (every request's context)",
               "cost per step (log.costs)"]
PRICES = {"cost/generation_seconds": 0.01, "cost/env_seconds": 0.001,
          "cost/generated_tokens": 2e-6, "cost/prompt_tokens": 0.5e-6}
"""The fixture's price table, per logged figure."""


def without_validation(records):
    return [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records
            if any(not k.startswith(("eval/", "time/eval")) and k != "step" for k in r)]


def check_axes(fig) -> list[str]:
    """Every axis has lines and a legend; returns the titles."""
    for ax in fig.axes:
        assert ax.lines, f"empty axis {ax.get_title()!r}"
        legend = ax.get_legend()
        assert legend is not None, f"no legend on {ax.get_title()!r}"
        assert len(legend.get_texts()) == len([ln for ln in ax.lines
                                               if not ln.get_label().startswith("_")])
    return [ax.get_title() for ax in fig.axes]


@pytest.mark.parametrize("validation", [True, False])
def test_report_has_no_empty_axes_and_a_legend_everywhere(sampled_run, validation) -> None:
    records = read_metrics(sampled_run)
    if not validation:
        records = without_validation(records)
    fig = build_figure({"run": records}, "eval/accuracy", 0.5, smooth=2)
    titles = check_axes(fig)
    plt.close(fig)
    validation_axes = [t for t in titles if t.startswith("eval/accuracy vs")]
    assert len(validation_axes) == (4 if validation else 0)
    assert len([t for t in titles if t.startswith("training reward")]) == 4
    assert [t for t in titles if t in AGENT_TITLES] == AGENT_TITLES
    # "truncated rollouts by reason" is drawn only when the run truncated a rollout
    truncated = any(v for r in records for k, v in r.items() if k.startswith("truncated/"))
    assert [t for t in titles if t in COST_TITLES] == COST_TITLES
    assert "sandbox seconds per step" not in titles  # no environment ran the sandbox
    rewarded = any(k.endswith("cost/per_reward_point") for r in records for k in r)
    assert len(titles) == (20 if validation else 16) + len(COST_TITLES) + truncated + rewarded
    assert "compactions by the policy's tool per rollout" not in titles  # never moved


def test_agent_panels_draw_each_environment_and_every_reason(sampled_run) -> None:
    records = read_metrics(sampled_run)
    extra = {"truncated/context_budget": 1.0, "env/longtool/truncated/context_budget": 1.0,
             "invalid/bad_reward": 2.0, "env/short/invalid/bad_reward": 2.0}
    records = [{**r, **extra} if r["step"] > 0 else r for r in records]
    fig = build_figure({"a": records, "b": records}, "eval/accuracy", None)
    check_axes(fig)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    labels = [t.get_text() for t in by_title["rows per rollout"].get_legend().get_texts()]
    assert labels == ["a · all", "a · longtool", "a · short", "b · all", "b · longtool",
                      "b · short"]
    truncation = [t.get_text() for t in
                  by_title["truncated rollouts by reason"].get_legend().get_texts()]
    logged = sorted({k for r in records for k, v in r.items()
                     if k.startswith(("truncated/", "env/")) and "truncated/" in k and v})
    reasons = [k.removeprefix("env/").replace("/truncated/", " · ").removeprefix("truncated/")
               for k in logged if k.startswith("truncated/")] + [
               k.removeprefix("env/").replace("/truncated/", " · ")
               for k in logged if k.startswith("env/")]
    assert "context_budget" in reasons and "longtool · context_budget" in reasons
    assert truncation == [f"{run} · {reason}" for run in "ab" for reason in reasons]
    invalid = by_title["invalid rollouts by reason"]
    assert [ln.get_ydata().tolist() for ln in invalid.lines] == [[2.0, 2.0]] * 4
    tool_errors = by_title["tool errors by kind"]
    by_label = {ln.get_label(): ln.get_ydata().tolist() for ln in tool_errors.lines}
    assert by_label["a · longtool · tool_exception"] == [4.0, 4.0]  # 4 longtool rollouts
    plt.close(fig)


def test_panels_not_logged_are_left_out() -> None:
    keys = all_keys([[{"step": 1, "num_turns/mean": 2.0, "env/a/num_turns/mean": 2.0,
                       "tool_errors": 0.0, "env/a/truncation_rate": None}]])
    assert [(p.title, [s.label for s in p.series]) for p in agent_panels(keys)] == [
        ("turns per rollout", ["all", "a"])]


def test_report_command_writes_the_png(sampled_run, tmp_path) -> None:
    out = tmp_path / "report.png"
    assert main(["report", str(sampled_run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cost_panels_draw_what_the_price_table_made_of_each_step(sampled_run) -> None:
    records = [r for r in read_metrics(sampled_run) if "cost/step" in r]
    assert len(records) == 2  # both training steps
    running = 0.0
    for record in records:
        for prefix in ("", "env/longtool/", "env/short/"):
            priced = sum(record[prefix + key] * rate for key, rate in PRICES.items())
            assert record[prefix + "cost/step"] == pytest.approx(priced)
            assert record[prefix + "cost/generation_seconds"] > 0
            tokens = record[prefix + "cost/generated_tokens"]
            assert record[prefix + "cost/prompt_tokens"] > tokens > 0
        assert record["cost/step"] == pytest.approx(
            record["env/longtool/cost/step"] + record["env/short/cost/step"])
        running += record["cost/step"]
        assert record["cumulative/cost"] == pytest.approx(running)
        # synchronous collection: the engine was busy only inside the generation phase
        assert record["cost/generation_seconds"] <= record["time/generate"]
        # no dynamic sampling: the rollouts played are the ones trained
        reward_sum = record["reward/mean"] * record["num_rollouts"]
        assert record["cost/per_reward_point"] == pytest.approx(record["cost/step"] / reward_sum)
    fig = build_figure({"run": read_metrics(sampled_run)}, "eval/accuracy", None)
    check_axes(fig)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    cost = by_title["cost per step (log.costs)"]
    assert [ln.get_label() for ln in cost.lines] == ["all", "longtool", "short"]
    assert cost.lines[1].get_ydata().tolist() == [r["env/longtool/cost/step"] for r in records]
    assert "all" in [ln.get_label() for ln in by_title["cost per reward point (log.costs)"].lines]
    prompt = by_title["prompt tokens per step (every request's context)"]
    assert prompt.lines[2].get_ydata().tolist() == [r["env/short/cost/prompt_tokens"]
                                                    for r in records]
    generated = by_title["generated tokens per step"]
    assert generated.lines[0].get_ydata().tolist() == [r["cost/generated_tokens"]
                                                       for r in records]
    plt.close(fig)


def test_retried_and_kept_failures_get_a_panel_each(sampled_run) -> None:
    records = read_metrics(sampled_run)
    extra = {"retried/reset_raised": 3.0, "env/short/retried/reset_raised": 3.0,
             "kept/max_rollout_tokens": 1.0, "env/longtool/kept/max_rollout_tokens": 1.0}
    records = [{**r, **extra} if r["step"] > 0 else r for r in records]
    fig = build_figure({"a": records}, "eval/accuracy", None)
    check_axes(fig)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    retried = by_title["retried attempts by reason (infrastructure)"].get_legend().get_texts()
    assert [t.get_text() for t in retried] == ["reset_raised", "short · reset_raised"]
    kept = by_title["policy-caused failures trained, by reason"].get_legend().get_texts()
    assert [t.get_text() for t in kept] == ["max_rollout_tokens", "longtool · max_rollout_tokens"]
    plt.close(fig)

"""``agentrl eval --sweep``: held-out accuracy with a 95% interval at every cell of a grid
of environment and compaction settings, beside the baselines, with compaction figures;
bad keys and values refused in one line before any model loads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.cli import main
from agentrl.config import config_from_dict
from agentrl.rollout.sweep import parse_sweep, plan_sweep, wilson_interval

PAGES = "tests.rollout.eval_envs:Pages"


def write_config(tmp_path, budget: int = 120):
    toml = tmp_path / "sweep.toml"
    toml.write_text(
        f'[[environments]]\nid = "{PAGES}"\nname = "pages"\n'
        "kwargs = { num_pages = 2, always = [0, 2], page_words = 4 }\n"
        "[batch]\nrollout_batch_size = 1\nn_samples_per_prompt = 1\nglobal_batch_size = 1\n"
        "[rollout]\nmax_turns = 12\nmax_new_tokens = 2\nmax_rollout_tokens = 400\n"
        f'[compaction]\nstrategy = "drop_oldest"\nmax_context_tokens = {budget}\n'
        "keep_last_turns = 0\nmax_compactions = 20\n")
    return toml


def table(out: str) -> list[list[str]]:
    """The printed table's rows (header first), cells split on runs of 2+ spaces."""
    import re

    lines = [line for line in out.splitlines() if line and not line.startswith("wrote ")]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_wilson_interval_matches_worked_values():
    # 2 of 4: centre (0.5 + z²/8) / (1 + z²/4) = 0.5, half-width 0.34997
    low, high = wilson_interval(2, 4)
    assert low == pytest.approx(0.15003, abs=1e-4) and high == pytest.approx(0.84997, abs=1e-4)
    # 0 of 10: [0, z² / (n + z²)] = [0, 0.27753]
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)


@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_holds_its_estimate_exactly(counts):
    """The bounds hold the estimate with no rounding left over (128 of 128 gave an upper
    bound a hair below 1.0, and the sweep's plot refused the negative error bar)."""
    correct, tasks = counts
    low, high = wilson_interval(correct, tasks)
    assert 0.0 <= low <= correct / tasks <= high <= 1.0
    assert (high == 1.0) == (correct == tasks) and (low == 0.0) == (correct == 0)


def test_two_page_counts_by_two_strategies_give_one_row_per_cell(tiny_ckpt, tmp_path, capsys):
    """Tasks 0 and 2 of 4 are solved whenever the episode reaches its last page: 2 pages
    fit the budget under both strategies (0.5); 6 pages do not, so ``truncate`` ends
    every rollout early (0.0) while ``drop_oldest`` compacts and finishes (0.5)."""
    plot, rows_json = tmp_path / "curve.png", tmp_path / "rows.json"
    assert main(["eval", str(write_config(tmp_path)), "--checkpoint", str(tiny_ckpt),
                 "--tasks", "4", "--sweep", "num_pages=2,6",
                 "--sweep", "compaction.strategy=drop_oldest,truncate", "--baselines", "none",
                 "--plot", str(plot), "--json", str(rows_json)]) == 0
    rows = table(capsys.readouterr().out)
    assert rows[0][:7] == ["num_pages", "compaction.strategy", "method", "env", "accuracy",
                           "95% interval", "n"]
    cells = {(r[0], r[1]): r for r in rows[1:]}
    assert len(rows) == 5 and len(cells) == 4  # one row per cell
    interval_2_of_4 = "[0.150, 0.850]"
    for pages in ("2", "6"):
        assert cells[pages, "drop_oldest"][4:7] == ["0.500", interval_2_of_4, "4"]
    assert cells["2", "truncate"][4:7] == ["0.500", interval_2_of_4, "4"]
    assert cells["6", "truncate"][4:7] == ["0.000", "[0.000, 0.490]", "4"]
    assert cells["6", "truncate"][-2].startswith("1.00 (context_budget)")
    # compaction figures: forced compactions per rollout, fact survival where compacted
    assert float(cells["6", "drop_oldest"][8]) >= 1.0 and cells["6", "drop_oldest"][9] == "0.00"
    assert float(cells["6", "truncate"][8]) == 0.0 and cells["6", "truncate"][9] == "-"
    assert plot.stat().st_size > 0
    saved = json.loads(rows_json.read_text())
    assert saved["trained"] == {"num_pages": 2, "compaction.strategy": "drop_oldest"}
    assert len(saved["rows"]) == 4 and {"low", "high"} <= set(saved["rows"][0])


def test_baselines_are_played_beside_the_policy_once_each(tiny_ckpt, tmp_path, capsys):
    """Each baseline is played once: the drop_oldest baseline of the tool cell is the
    drop_oldest cell's own policy row, and the full context (no budget) is the same for
    both cells."""
    assert main(["eval", str(write_config(tmp_path, budget=160)), "--checkpoint",
                 str(tiny_ckpt), "--tasks", "2", "--sweep", "num_pages=2",
                 "--sweep", "compaction.strategy=tool,drop_oldest",
                 "--plot", str(tmp_path / "curve.png")]) == 0
    rows = table(capsys.readouterr().out)[1:]
    assert [(r[1], r[2]) for r in rows] == [("tool", "policy"), ("tool", "full"),
                                            ("drop_oldest", "policy")]


def test_with_one_strategy_both_baselines_join_each_cell():
    settings, left_out = plan_sweep(config(), [parse_sweep("num_pages=2,4")])
    assert [(s.cell["num_pages"], s.method, s.config.compaction.strategy) for s in settings] \
        == [(2, "policy", "tool"), (2, "drop_oldest", "drop_oldest"), (2, "full", "none"),
            (4, "policy", "tool"), (4, "drop_oldest", "drop_oldest"), (4, "full", "none")]
    assert [s.config.environments[0].kwargs["num_pages"] for s in settings] == [2] * 3 + [4] * 3
    assert left_out == []


def config():
    return config_from_dict({
        "environments": [{"id": PAGES, "name": "pages", "kwargs": {"num_pages": 2}}],
        "compaction": {"strategy": "tool", "max_context_tokens": 200},
        "batch": {"rollout_batch_size": 1, "n_samples_per_prompt": 1, "global_batch_size": 1},
    })


@pytest.mark.parametrize(("sweep", "names"), [
    ("num_pagez=2,4", ["num_pagez", "unknown key", "compaction.strategy", "num_pages",
                       "page_words"]),
    ("compaction.strategy=tool,bogus", ["compaction.strategy", "'bogus'", "drop_oldest",
                                        "summarize"]),
    ("compaction.max_context_tokens=0", ["compaction.max_context_tokens", ">= 1"]),
    ("num_pages=3,0", ["num_pages=0", "'pages'", "num_pages must be >= 1"]),
    ("num_pages", ["KEY=V1,V2"]),
])
def test_bad_keys_and_values_are_refused_in_one_line(sweep, names):
    with pytest.raises(ValueError) as caught:
        plan_sweep(config(), [parse_sweep(sweep)])
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_the_cli_refuses_a_bad_key_before_loading_a_model(tmp_path, capsys):
    code = main(["eval", str(write_config(tmp_path)), "--checkpoint",
                 str(tmp_path / "no-such-model"), "--sweep", "pagez=1,2"])
    assert code != 0
    err = capsys.readouterr().err
    assert "--sweep pagez: unknown key" in err and "num_pages" in err


def test_a_bad_baseline_is_named():
    with pytest.raises(ValueError, match="'oldest'.*drop_oldest, full"):
        plan_sweep(config(), [parse_sweep("num_pages=2")], ["oldest"])


def test_the_curve_spaces_doublings_evenly():
    from agentrl.commands.eval_sweep import plot_axis, x_positions

    positions = x_positions([6, 12, 24, 48])
    assert [positions[v] - positions[6] for v in (12, 24, 48)] == pytest.approx([1, 2, 3])
    assert x_positions([120, 160]) == {120: 120.0, 160: 160.0}
    assert x_positions(["tool", "drop_oldest"]) == {"tool": 0.0, "drop_oldest": 1.0}
    axes = [parse_sweep("compaction.max_context_tokens=120,200"),
            parse_sweep("compaction.strategy=tool,drop_oldest"), parse_sweep("num_pages=6,12")]
    assert plot_axis(axes) == "num_pages"  # the task's length first
    assert plot_axis(axes[:2]) == "compaction.max_context_tokens"

"""``agentrl sft --base curriculum``: a new tiny model whose tokenizer knows the
environments' words and the drills', pretrained on the drills alone before the
environments' warm start."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import config_from_dict
from agentrl.curriculum import fitted_base
from agentrl.curriculum.fitted_base import CurriculumRecipe, drill_config
from agentrl.model import load_tokenizer
from agentrl.model.base import generic_base

LEDGER = {"id": "agentrl/Ledger-v0", "name": "ledger",
          "kwargs": {"num_pages": 3, "num_facts": 2, "filler_words": 6}}


def _config(**compaction):
    return config_from_dict({
        "environments": [LEDGER],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 1, "global_batch_size": 2},
        "rollout": {"max_turns": 6, "max_rollout_tokens": 200},
        "compaction": {"strategy": "summarize", "max_context_tokens": 180, **compaction},
    })


def test_the_drill_stage_keeps_the_budget_and_plays_only_drills() -> None:
    drills = drill_config(_config())
    assert [e.id for e in drills.environments] == ["agentrl/Drill-v0"]
    assert drills.compaction.strategy == "tool"
    assert drills.compaction.max_context_tokens == 180  # the environment's own budget
    assert drills.rollout.max_turns >= 16  # six reads, their compactions and the answer


def test_curriculum_base_trains_drills_first_with_the_environments_words_whole(
        tmp_path, monkeypatch) -> None:
    """The drill stage trains on drills alone, the environment's stage on its own
    demonstrations, and the tokenizer (fitted to both texts) keeps Ledger's entry words
    whole, where the shipped base's splits them into letters."""
    import agentrl.train.sft as sft
    from agentrl.train.sft import WarmStartConfig, warm_start

    monkeypatch.setattr(fitted_base, "RECIPE", CurriculumRecipe(
        copy_steps=2, steps=2, rows_per_step=2, num_demonstrations=4))
    trained: list[set[str]] = []
    real_step = sft.sft_step
    monkeypatch.setattr(sft, "sft_step", lambda model, rows, *a: trained.append(
        {r.env for r in rows}) or real_step(model, rows, *a))
    ws = WarmStartConfig(num_steps=3, rows_per_step=2, num_demonstrations=4, hidden_size=32,
                         num_layers=1)
    out = warm_start(_config(), tmp_path / "out", ws, base="curriculum", log=lambda _: None)
    assert trained == [{"drill"}] * 2 + [{"ledger"}] * 3
    tokenizer = load_tokenizer(out)
    words = ("harbor", "kestrel", "yarrow")
    assert [len(tokenizer.encode(f" {w}")) for w in words] == [1, 1, 1]
    shipped = load_tokenizer(generic_base())
    assert all(len(shipped.encode(f" {w}")) > 2 for w in words)
    assert len(tokenizer.encode("Page 37 of 48.")) <= 12  # the drills' text is fitted too


def test_the_cli_builds_the_curriculum_base_with_the_generic_bases_depth(monkeypatch) -> None:
    """--base curriculum takes the new-model options (and 4 layers by default)."""
    import argparse

    import agentrl.train.sft as sft
    from agentrl.commands import sft as command

    seen = {}
    monkeypatch.setattr(sft, "warm_start", lambda config, out, ws, base, **_: seen.update(
        ws=ws, base=base) or out)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config = Path(__file__).resolve().parents[2] / "configs" / "ledger_lengths.toml"
    args = parser.parse_args([str(config), "--out", "x", "--base",
                              "curriculum", "--hidden-size", "64"])
    assert command.run(args) == 0
    assert seen["base"] == "curriculum"
    assert seen["ws"].num_layers == fitted_base.LAYERS and seen["ws"].hidden_size == 64
    with pytest.raises(Exception, match="add --base new or --base curriculum"):
        command.resolve_base(parser.parse_args(["c.toml", "--out", "x", "--base", "assets/b",
                                                "--num-layers", "3"]))

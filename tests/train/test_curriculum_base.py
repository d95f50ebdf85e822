"""``agentrl sft --base curriculum``: a new tiny model whose tokenizer is fitted to the
drills with the config's environments at a small share, trained on that mix before the
environments' own warm start."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agentrl.config import config_from_dict
from agentrl.curriculum import fitted_base
from agentrl.curriculum.fitted_base import CurriculumRecipe, curriculum_config
from agentrl.model import load_tokenizer

LEDGER = {"id": "agentrl/Ledger-v0", "name": "ledger",
          "kwargs": {"num_pages": 3, "num_facts": 2, "filler_words": 6}}


def _config(**compaction):
    return config_from_dict({
        "environments": [LEDGER],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 1, "global_batch_size": 2},
        "rollout": {"max_turns": 6, "max_rollout_tokens": 200},
        "compaction": {"strategy": "summarize", "max_context_tokens": 180, **compaction},
    })


def test_the_curriculum_is_the_drills_with_the_environments_at_a_small_share() -> None:
    mix = curriculum_config(_config())
    assert [e.id for e in mix.environments] == ["agentrl/Ledger-v0", "agentrl/Drill-v0"]
    weights = [e.weight for e in mix.environments]
    assert weights[0] / sum(weights) == pytest.approx(fitted_base.ENV_SHARE)
    assert mix.compaction.strategy == "summarize"  # the config's summary strategy
    assert mix.compaction.max_context_tokens == 180  # the environment's own budget
    assert mix.rollout.max_turns >= 16  # six reads, their compactions and the answer
    none = _config()
    none = msgspec.structs.replace(none, compaction=msgspec.structs.replace(
        none.compaction, strategy="drop_oldest"))
    assert curriculum_config(none).compaction.strategy == "tool"  # drills keep by summary


def test_curriculum_base_trains_the_mix_then_the_environment(tmp_path, monkeypatch) -> None:
    """The curriculum stage plays the drills and the environment in the mix's shares from
    a model whose tokenizer was fitted to that mix's text; the environment's stage plays
    the environment alone, from the curriculum's weights."""
    import agentrl.train.sft as sft
    from agentrl.train.sft import WarmStartConfig, warm_start

    monkeypatch.setattr(fitted_base, "RECIPE", CurriculumRecipe(
        copy_steps=2, steps=2, rows_per_step=2, num_demonstrations=40))
    played: list[dict[str, float]] = []
    real = sft.demonstrations_under
    monkeypatch.setattr(sft, "demonstrations_under", lambda config, *a, **k: played.append(
        {e.display_name(): e.weight for e in config.environments}) or real(config, *a, **k))
    steps: list[int] = []
    real_step = sft.sft_step
    monkeypatch.setattr(sft, "sft_step", lambda model, rows, *a: steps.append(len(rows)) or
                        real_step(model, rows, *a))
    ws = WarmStartConfig(num_steps=3, rows_per_step=2, num_demonstrations=4, hidden_size=32,
                         num_layers=1)
    out = warm_start(_config(), tmp_path / "out", ws, base="curriculum", log=lambda _: None)
    assert [sorted(p) for p in played] == [["drill", "ledger"], ["ledger"]]
    assert len(steps) == 2 + 3
    tokenizer = load_tokenizer(out)
    assert len(tokenizer.encode(" ledger")) == 1  # the environment's text was fitted
    assert len(tokenizer.encode("What is salt?")) <= 4  # and the drills'


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
    args = parser.parse_args([str(config), "--out", "x", "--base", "curriculum",
                              "--keyed-steps", "40", "--copy-rows", "2"])
    assert command.run(args) == 0
    assert seen["ws"].keyed_steps == 40 and seen["ws"].copy_rows == 2
    stage = fitted_base.curriculum_stage(seen["ws"])  # the keyed stage follows its copy stage
    assert stage.keyed_steps == 40 and stage.copy_steps == fitted_base.RECIPE.copy_steps
    with pytest.raises(Exception, match="--keyed-steps 40 follows the copy steps"):
        command.run(parser.parse_args([str(config), "--out", "x", "--keyed-steps", "40"]))


def test_check_env_measures_with_the_tokenizer_the_curriculum_base_will_have() -> None:
    """``check-env --base curriculum`` fits the same mix's tokenizer that ``agentrl sft
    --base curriculum`` starts from, so its token counts are the run's."""
    from agentrl.train.demonstration_check import check_tokenizer

    tokenizer, name, stand_in = check_tokenizer(_config(), "curriculum")
    assert stand_in is None and "--base curriculum" in name
    assert len(tokenizer.encode(" ledger")) == 1 and len(tokenizer.encode("What is salt?")) <= 4


def test_a_config_with_its_own_drill_keeps_it_apart_from_the_curriculum_drills() -> None:
    """Shares and demonstrations are counted by environment name: a config whose own
    environment is named like the curriculum's drills (``configs/drill_keep.toml``) must
    keep both, each in its share, instead of one silently replacing the other."""
    own = {"id": "agentrl/Drill-v0", "name": "drill",
           "kwargs": {"facts_per_page": 3, "keeps": "random"}}
    config = config_from_dict({
        "environments": [own],
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 1, "global_batch_size": 2},
        "compaction": {"strategy": "tool", "max_context_tokens": 200},
    })
    mix = curriculum_config(config)
    names = [e.display_name() for e in mix.environments]
    assert names[0] == "drill" and len(set(names)) == 2, names
    assert mix.environments[0].kwargs["keeps"] == "random"
    assert mix.environments[1].kwargs == fitted_base.DRILLS.kwargs
    assert mix.environments[0].weight / sum(e.weight for e in mix.environments) \
        == pytest.approx(fitted_base.ENV_SHARE)


def test_every_option_of_every_command_says_what_it_does() -> None:
    """`agentrl CMD --help` explains each flag; sft's integer knobs name their default."""
    import argparse

    from agentrl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    silent = [(name, action.dest) for name, parser in sub.choices.items()
              for action in parser._actions if not action.help]
    assert silent == []
    sft_help = sub.choices["sft"].format_help()
    assert "optimizer steps of supervised training (default 300)" in " ".join(sft_help.split())

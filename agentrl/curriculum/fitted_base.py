"""A base built for one config: the drills' generic skills, the environments' words whole.

The shipped generic base (``assets/base``) has a tokenizer fitted to the drills' text
only, so a new environment's words fall apart into letters (``Entry: yarrow`` is nine
tokens, ``' '`` among them, which follows every word): copying a word after its label
then needs a match over several tokens, which the small base does not make (Ledger's
warm start from it copies its own summary about 60 % of the time). ``agentrl sft
--base curriculum`` instead builds a new tiny model whose tokenizer is fitted to the
config's environments' text *and* the drills', pretrains it on copying and on the
drill curriculum (never the environments' tasks: their text shapes only the
tokenizer), and hands it to the environments' warm start. Measured on Ledger trained at
6 pages: held-out 1.000 at 6 pages and 0.938 at 48 (``docs/base-model.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from agentrl.config import Config, EnvironmentConfig

CURRICULUM = "curriculum"
"""``agentrl sft --base curriculum``: build the base for this config first."""
DRILLS = EnvironmentConfig(id="agentrl/Drill-v0", name="drill",
                           kwargs={"max_pages": 6, "facts_per_page": 2, "filler_words": 8})
"""The drill curriculum of ``configs/base.toml``."""
LAYERS = 4
"""Layers of the curriculum base when ``--num-layers`` is not given (the generic base's)."""


class CurriculumRecipe(msgspec.Struct, frozen=True, kw_only=True):
    """How the base is pretrained before the environments' warm start (the generic
    base's recipe, shorter: ~5 minutes on 2 idle cores)."""

    copy_steps: int = 2000
    steps: int = 1200
    rows_per_step: int = 16
    num_demonstrations: int = 3000
    lr: float = 2e-3
    warmup_steps: int = 20


RECIPE = CurriculumRecipe()
"""The recipe ``agentrl sft --base curriculum`` uses."""


def drill_config(config: Config) -> Config:
    """The config with the drill curriculum as its only environment, played under the
    ``tool`` strategy with the config's context budget and enough turns for a read of
    six pages, its compactions and the answer."""
    rollout = msgspec.structs.replace(
        config.rollout, max_turns=max(config.rollout.max_turns, 16),
        max_rollout_tokens=max(config.rollout.max_rollout_tokens, 400))
    compaction = msgspec.structs.replace(config.compaction, strategy="tool",
                                         fallback="drop_oldest")
    return msgspec.structs.replace(config, environments=[DRILLS], rollout=rollout,
                                   compaction=compaction)


def curriculum_base(config: Config, ws: object, folder: Path,
                    fit_model: Callable[[list[Config]], Path],
                    train: Callable[[Config, Path, object, str], Path],
                    recipe: CurriculumRecipe | None = None) -> Path:
    """A new tiny model fitted to ``config``'s and the drills' text (``fit_model``),
    copy-pretrained and trained on the drills alone (``train``: the warm start itself),
    written under ``folder``; the environments' warm start continues from it."""
    recipe = recipe or RECIPE
    drills = drill_config(config)
    fitted = fit_model([config, drills])
    stage = msgspec.structs.replace(
        ws, copy_steps=recipe.copy_steps, num_steps=recipe.steps,
        rows_per_step=recipe.rows_per_step, num_demonstrations=recipe.num_demonstrations,
        lr=recipe.lr, warmup_steps=recipe.warmup_steps, lr_schedule="cosine",
        strategies=[], compact_share=1.0, recall_rows=0)
    return train(drills, folder / "curriculum", stage, str(fitted))

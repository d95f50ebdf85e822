"""A base built for one config: the drills' generic skills, learned beside the environment.

``agentrl sft`` from the shipped generic base (``assets/base``) learns a new
environment's layout after the drills, with a tokenizer that never saw its text; the
Ledger warm start from it copied its own summary into the answer about 60 % of the
time, at every length. ``agentrl sft --base curriculum`` instead builds a new tiny model
for the config: its tokenizer is fitted to the curriculum's text (the drills, with the
config's environments at a 5 % share), it is copy-pretrained and trained on that
curriculum, and the environments' own warm start continues from it. The drills (page
numbers up to 99, reads of any length, facts in several formats) are most of what it
sees, so the environment's layout is learned as one more instance of the generic skills
rather than by its own numbers. Measured (``docs/base-model.md``): Ledger trained at 6
pages held >= 0.9 at 48 pages in three runs of three, Voyage in one of three; without the
environments in the curriculum's mix and its tokenizer's text, the same models broke at
12 pages ("Page 12 of 12." ended the answer's format).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from agentrl.config import Config, EnvironmentConfig

WarmStart = TypeVar("WarmStart", bound=msgspec.Struct)
"""``agentrl.train.sft.WarmStartConfig``, typed by its base class: ``agentrl.train`` is a
higher layer, which this module may not import."""

CURRICULUM = "curriculum"
"""``agentrl sft --base curriculum``: build the base for this config first."""
DRILLS = EnvironmentConfig(id="agentrl/Drill-v0", name="drill",
                           kwargs={"max_pages": 6, "facts_per_page": 2, "filler_words": 8})
"""The drill curriculum of ``configs/base.toml``."""
LAYERS = 4
"""Layers of the curriculum base when ``--num-layers`` is not given (the generic base's)."""
ENV_SHARE = 0.05
"""The environments' share of the curriculum's demonstrations and of the text its
tokenizer is fitted to; the drills take the rest."""


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


def curriculum_config(config: Config, share: float = ENV_SHARE) -> Config:
    """The config's environments beside the drills, which get ``1 - share`` of the
    demonstrations; enough turns for a read of six pages, its compactions and the answer;
    the config's summary strategy (``tool`` when it has none, so drills can keep facts)."""
    total = sum(env.weight for env in config.environments)
    drills = msgspec.structs.replace(DRILLS, weight=total * (1 - share) / share,
                                     name=_free_name(config, DRILLS.display_name()))
    rollout = msgspec.structs.replace(
        config.rollout, max_turns=max(config.rollout.max_turns, 16),
        max_rollout_tokens=max(config.rollout.max_rollout_tokens, 400))
    compaction = config.compaction
    if compaction.strategy not in ("tool", "summarize"):
        compaction = msgspec.structs.replace(compaction, strategy="tool",
                                             fallback="drop_oldest")
    return msgspec.structs.replace(config, environments=[*config.environments, drills],
                                   rollout=rollout, compaction=compaction)


def _free_name(config: Config, name: str) -> str:
    """``name``, or ``name`` with a number added when one of the config's environments
    already has it (a config training a drill of its own): demonstrations and shares are
    counted by name, so two environments of one name would merge into one."""
    taken = {env.display_name() for env in config.environments}
    return next(candidate for candidate in (name, *(f"{name}_{i}" for i in range(2, 99)))
                if candidate not in taken)


def curriculum_stage(ws: WarmStart) -> WarmStart:
    """The warm-start settings of the curriculum stage: ``RECIPE`` over ``ws`` (which keeps
    the model's shape and the seed)."""
    return msgspec.structs.replace(
        ws, copy_steps=RECIPE.copy_steps, num_steps=RECIPE.steps,
        rows_per_step=RECIPE.rows_per_step, num_demonstrations=RECIPE.num_demonstrations,
        lr=RECIPE.lr, warmup_steps=RECIPE.warmup_steps, lr_schedule="cosine",
        strategies=[], compact_share=1.0, recall_rows=0)

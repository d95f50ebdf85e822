"""Logging settings (``[log]``: live display, samples, W&B, MLflow, the price table).

Units and ranges: see ``agentrl.config.settings``.
"""

from __future__ import annotations

from typing import Literal

from agentrl.config.ranges import (
    NonNegativeFloat,
    NonNegativeInt,
)
from agentrl.config.section import _Section


class WandbConfig(_Section):
    project: str
    """The Weights & Biases project the run is logged to."""
    entity: str = ""
    """Team or user owning the project; "" the account's default."""
    name: str = ""
    """Run name; "" the run folder's name."""
    group: str = ""
    """Group of runs it belongs to (e.g. a sweep); "" none."""
    tags: list[str] = []
    """Tags of the run."""
    mode: Literal["", "online", "offline", "disabled"] = ""
    """"offline" writes RUN_DIR/wandb/ only (upload later with `wandb sync`), "online" also
    streams it to the server; "" follows WANDB_MODE (online when unset)."""


class MlflowConfig(_Section):
    tracking_uri: str = ""
    """Where runs are stored: a server ("http://host:5000") or a database
    ("sqlite:///path/mlflow.db"); "" follows MLFLOW_TRACKING_URI, else
    sqlite:///RUN_DIR/mlflow.db (a local store, no server)."""
    experiment: str = "agentrl"
    """Experiment the run is logged under (created when missing)."""
    run_name: str = ""
    """Run name; "" the run folder's name."""


class CostsConfig(_Section):
    """A price table (``[log.costs]``; absent: seconds and tokens are logged, no cost).
    Each figure of a step is multiplied by its price and the products added up: the
    step's cost, per environment and overall (``cost/step``, ``cumulative/cost``,
    ``cost/per_reward_point``). Any currency; every price >= 0, default 0."""

    per_generation_second: NonNegativeFloat = 0.0
    """Price of one second of the engine's busy time (``cost/generation_seconds``: the
    seconds in which a request was in flight, shared among the requests then; with several
    replicas, the price of them all)."""
    per_env_second: NonNegativeFloat = 0.0
    """Price of one second of environment calls (``cost/env_seconds``)."""
    per_sandbox_second: NonNegativeFloat = 0.0
    """Price of one second of sandboxed runs (``cost/sandbox_seconds``), charged on top
    of ``per_env_second`` (those seconds are part of the environment calls)."""
    per_million_generated_tokens: NonNegativeFloat = 0.0
    """Price of a million tokens the engine generated (``cost/generated_tokens``)."""
    per_million_prompt_tokens: NonNegativeFloat = 0.0
    """Price of a million prompt tokens sent to the engine, the whole context of every
    request (``cost/prompt_tokens``)."""


class LogConfig(_Section):
    live: bool = True
    """Live terminal display during training."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder."""
    rollouts_every: NonNegativeInt = 1
    """Steps between rollout samples written to RUN_DIR/rollouts/step_NNNNNN.jsonl (per
    environment the best, the worst and a few random rollouts, decoded); >= 0; 0 disables."""
    rollouts_random_per_env: NonNegativeInt = 2
    """Rollouts per environment drawn at random (seeded by train.seed and the step) for
    each sample, besides the best and the worst; >= 0."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases (extra `wandb`): every figure of metrics.jsonl at its
    step, the run config, and each rollout sample as a table. None: off."""
    mlflow: MlflowConfig | None = None
    """Also log to MLflow (extra `mlflow`): the same figures, the config (as parameters and
    config.json) and the rollout samples as tables. None: off."""
    costs: CostsConfig | None = None
    """A price table that turns each step's seconds and tokens into cost, per environment
    and per reward point (``[log.costs]``). None: seconds and tokens only."""

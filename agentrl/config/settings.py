"""Run configuration: the top-level Config and its sections, every field documented.

The sections live by component: ``train_settings`` (model, batch, loss, advantage,
optim, train), ``rollout_settings`` (rollout, compaction), ``env_settings``
(environments, harness, endpoint), ``log_settings`` (log, W&B, MLflow, costs).

Loading (TOML, ``--set``) is ``agentrl.config.load``; the load-time checks are
``agentrl.config.checks``.

Every field says its unit and its range. Counts of the batch are in *rollouts*
(responses) or *groups*, never rows: a rollout that was compacted into several rows
still counts once. Ranges are part of the field types (``agentrl.config.ranges``: e.g.
``Probability`` is (0, 1]); every float must also be finite. A value outside its range
is refused at load time in one line naming the setting, the value, the range and the fix.
"""

from __future__ import annotations

import msgspec

from agentrl.config.env_settings import EndpointConfig, EnvironmentConfig
from agentrl.config.log_settings import LogConfig
from agentrl.config.rollout_settings import CompactionConfig, RolloutConfig
from agentrl.config.section import _Section
from agentrl.config.train_settings import (
    AdvantageConfig,
    BatchConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)


class Config(_Section):
    environments: list[EnvironmentConfig]
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    advantage: AdvantageConfig = msgspec.field(default_factory=AdvantageConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    compaction: CompactionConfig = msgspec.field(default_factory=CompactionConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    endpoint: EndpointConfig = msgspec.field(default_factory=EndpointConfig)

    def group_size(self, env: EnvironmentConfig) -> int:
        """Rollouts per group for one environment."""
        return env.group_size if env.group_size is not None else self.batch.n_samples_per_prompt


def num_local_engines(rollout: RolloutConfig) -> int:
    """Replicas the trainer starts: num_engines, or its default (1; 0 with servers)."""
    if rollout.num_engines is not None:
        return rollout.num_engines
    return 0 if rollout.remote_engines else 1

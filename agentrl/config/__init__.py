"""Run configuration: settings Structs, TOML loading and ``--set``, ranges, load-time
checks, the four-knob accounting, the lr schedule.

The names below are the stable API (``from agentrl.config import load_config, Config``).
"""

from agentrl.config.load import config_from_dict, load_config
from agentrl.config.ranges import ConfigError
from agentrl.config.settings import (
    SEQUENCE_LEVEL_AGGREGATIONS,
    AdvantageConfig,
    BatchConfig,
    CompactionConfig,
    Config,
    CostsConfig,
    EndpointConfig,
    EnvironmentConfig,
    HarnessConfig,
    LogConfig,
    LoRAConfig,
    LossConfig,
    MlflowConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
    WandbConfig,
    num_local_engines,
)

__all__ = [
    "SEQUENCE_LEVEL_AGGREGATIONS", "AdvantageConfig", "BatchConfig", "CompactionConfig",
    "Config", "ConfigError", "CostsConfig", "EndpointConfig", "EnvironmentConfig", "HarnessConfig",
    "LoRAConfig", "LogConfig", "LossConfig", "MlflowConfig", "ModelConfig", "OptimConfig",
    "RolloutConfig", "TrainConfig", "WandbConfig",
    "config_from_dict", "load_config", "num_local_engines",
]

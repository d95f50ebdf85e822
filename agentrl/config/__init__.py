"""Run configuration: settings Structs, TOML loading and ``--set``, ranges, load-time
checks, the four-knob accounting, the lr schedule.

The names below are the stable API (``from agentrl.config import load_config, Config``).
"""

from agentrl.config.env_settings import EndpointConfig, EnvironmentConfig, HarnessConfig
from agentrl.config.load import config_from_dict, load_config
from agentrl.config.log_settings import CostsConfig, LogConfig, MlflowConfig, WandbConfig
from agentrl.config.ranges import ConfigError
from agentrl.config.rollout_settings import CompactionConfig, RolloutConfig
from agentrl.config.settings import Config, num_local_engines
from agentrl.config.train_settings import (
    SEQUENCE_LEVEL_AGGREGATIONS,
    AdvantageConfig,
    BatchConfig,
    LoRAConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)

__all__ = [
    "SEQUENCE_LEVEL_AGGREGATIONS", "AdvantageConfig", "BatchConfig", "CompactionConfig",
    "Config", "ConfigError", "CostsConfig", "EndpointConfig", "EnvironmentConfig", "HarnessConfig",
    "LoRAConfig", "LogConfig", "LossConfig", "MlflowConfig", "ModelConfig", "OptimConfig",
    "RolloutConfig", "TrainConfig", "WandbConfig",
    "config_from_dict", "load_config", "num_local_engines",
]

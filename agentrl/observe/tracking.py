"""The experiment trackers a run asked for (``log.wandb``, ``log.mlflow``), beside the
JSONL record and TensorBoard; each imports its package only when configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import LogConfig


def tracking_writers(log: LogConfig, run_dir: str | Path, config: dict[str, Any],
                     resume: bool = False) -> list[Any]:
    """A W&B and/or an MLflow writer; ``config``: the resolved run config as plain data."""
    writers: list[Any] = []
    if log.wandb is not None:
        from agentrl.observe.wandb_writer import WandbWriter

        writers.append(WandbWriter(log.wandb, run_dir, config, resume))
    if log.mlflow is not None:
        from agentrl.observe.mlflow_writer import MlflowWriter

        writers.append(MlflowWriter(log.mlflow, run_dir, config, resume))
    return writers

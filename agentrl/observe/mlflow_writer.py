"""``log.mlflow``: every step's figures, the run config and the rollout samples to MLflow
(extra ``mlflow``, imported only here).

Each figure of ``metrics.jsonl`` is a metric at its step (non-finite ones, null in the
JSONL file, are left out; a character MLflow refuses in a key becomes ``_``); the resolved
config is logged as parameters (dotted keys) and as the artifact ``config.json``; each
rollout sample is the table artifact ``rollouts/step_NNNNNN.json``. With no
``tracking_uri`` (and no ``MLFLOW_TRACKING_URI``) the store is ``RUN_DIR/mlflow.db``, a
local SQLite file: no server, no network (``mlflow ui --backend-store-uri
sqlite:///RUN_DIR/mlflow.db`` shows it). The run's id is kept in ``RUN_DIR/mlflow_run_id``,
so ``--resume`` continues the same MLflow run (a step a killed run logged after its last
checkpoint is logged again when redone: MLflow then holds both values of that step).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from agentrl.config import MlflowConfig
from agentrl.config.extras import require
from agentrl.observe.writers import numeric_figures

RUN_ID_FILE = "mlflow_run_id"
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_CHARS = 6000
_BAD_KEY_CHARS = re.compile(r"[^\w\-. :/]")


def metric_key(key: str) -> str:
    """A figure's key as MLflow accepts it (letters, digits, ``_ - . : /`` and spaces)."""
    return _BAD_KEY_CHARS.sub("_", key)


def default_tracking_uri(run_dir: Path) -> str:
    """MLFLOW_TRACKING_URI, else a SQLite store in the run folder."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.resolve()}/mlflow.db"


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → dotted keys with text values (lists as JSON)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


class MlflowWriter:
    """One MLflow run per training run."""

    def __init__(self, settings: MlflowConfig, run_dir: str | Path, config: dict[str, Any],
                 resume: bool = False) -> None:
        """Open the store, find or create the experiment, start (or continue) the run."""
        tracking = require("mlflow.tracking", "log.mlflow")
        self.entities = require("mlflow.entities", "log.mlflow")
        run_dir = Path(run_dir)
        self.tracking_uri = settings.tracking_uri or default_tracking_uri(run_dir)
        self.client = tracking.MlflowClient(tracking_uri=self.tracking_uri)
        id_file = run_dir / RUN_ID_FILE
        if resume and id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(settings.experiment)
        experiment_id = experiment.experiment_id if experiment is not None else \
            self.client.create_experiment(
                settings.experiment,
                artifact_location=(run_dir / "mlflow-artifacts").resolve().as_uri())
        run = self.client.create_run(experiment_id,
                                     run_name=settings.run_name or run_dir.resolve().name)
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id + "\n")
        params = [self.entities.Param(k, v) for k, v in flat_params(config).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_PER_BATCH])
        self.client.log_dict(self.run_id, config, "config.json")

    def write(self, metrics: dict[str, Any]) -> None:
        """Log the step's finite figures at ``metrics["step"]``."""
        step, now = int(metrics.get("step", 0)), int(time.time() * 1000)
        batch = [self.entities.Metric(metric_key(k), float(v), now, step)
                 for k, v in numeric_figures(metrics).items()]
        for start in range(0, len(batch), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start:start + MAX_METRICS_PER_BATCH])

    def write_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """The step's sampled rollouts as the table ``rollouts/step_NNNNNN.json``."""
        data = {column: [row[i] for row in rows] for i, column in enumerate(columns)}
        self.client.log_table(self.run_id, data=data,
                              artifact_file=f"rollouts/step_{step:06d}.json")

    def close(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id)

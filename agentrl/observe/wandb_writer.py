"""``log.wandb``: every step's figures, the run config and the rollout samples to Weights &
Biases (extra ``wandb``, imported only here).

Each figure of ``metrics.jsonl`` is logged at its step under the same key (figures that
are not finite, null in the JSONL file, are left out); the resolved config is the run's
config; each rollout sample is a table ``rollouts`` at its step. ``mode = "offline"`` (or
``WANDB_MODE=offline``) writes ``RUN_DIR/wandb/`` and needs no network; ``wandb sync``
uploads it later. The run's id is kept in ``RUN_DIR/wandb_run_id``, so ``--resume``
continues the same W&B run (offline: a second ``offline-run-*`` folder with the same id,
which ``wandb sync`` adds to the run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config import WandbConfig
from agentrl.config.extras import require
from agentrl.observe.writers import numeric_figures

RUN_ID_FILE = "wandb_run_id"


class WandbWriter:
    """One W&B run per training run."""

    def __init__(self, settings: WandbConfig, run_dir: str | Path, config: dict[str, Any],
                 resume: bool = False) -> None:
        """Start (or, on resume, continue) the run; ``config``: the resolved run config."""
        self.wandb = require("wandb", "log.wandb")
        run_dir = Path(run_dir)
        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        self.run = self.wandb.init(
            project=settings.project, entity=settings.entity or None,
            name=settings.name or run_dir.resolve().name, group=settings.group or None,
            tags=settings.tags or None, mode=settings.mode or None, dir=str(run_dir),
            config=config, id=run_id, resume="allow" if resume else None,
            settings=self.wandb.Settings(console="off", silent=True))
        id_file.write_text(self.run.id + "\n")

    def write(self, metrics: dict[str, Any]) -> None:
        """Log the step's finite figures at ``metrics["step"]``."""
        self.run.log(numeric_figures(metrics), step=int(metrics.get("step", 0)))

    def write_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """The step's sampled rollouts as the table ``rollouts``."""
        self.run.log({"rollouts": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        """Finish the run (offline: flush RUN_DIR/wandb/)."""
        self.run.finish()

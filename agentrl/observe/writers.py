"""Where step metrics go: a JSONL file (the record), a live terminal display, TensorBoard.

Every writer takes the same flat dict (``{"step": 3, "reward/mean": 0.4, ...}``) once per
step; ``agentrl report`` reads the JSONL file back.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Protocol

METRICS_FILE = "metrics.jsonl"


class MetricWriter(Protocol):
    """Receives one flat dict of figures per step."""

    def write(self, metrics: dict[str, Any]) -> None:
        """Record the figures of one step."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


class JsonlWriter:
    """One JSON object per line in ``RUN_DIR/metrics.jsonl``, flushed after every step."""

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        """Open for appending; on resume, drop lines of steps after ``resume_step``.

        A run killed after writing a step's metrics but before its checkpoint would
        otherwise log that step twice once resumed.
        """
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [m for m in read_metrics(self.path) if m.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(m) + "\n" for m in kept))
        self._file = open(self.path, "a")  # noqa: SIM115 - closed in close()

    def write(self, metrics: dict[str, Any]) -> None:
        """Append the step as one line (non-finite floats become null: valid JSON)."""
        clean = {k: (None if _bad_float(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _bad_float(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def numeric_figures(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's finite numbers by key, without ``step`` itself (what trackers plot)."""
    return {k: v for k, v in metrics.items()
            if k != "step" and isinstance(v, int | float) and not _bad_float(v)}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every step of a ``metrics.jsonl`` file (a folder means its metrics.jsonl)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a crash ends the record
    return rows


class TensorBoardWriter:
    """Every numeric figure as a TensorBoard scalar at its step."""

    def __init__(self, log_dir: str | Path) -> None:
        """Open a SummaryWriter; tensorboard is an optional dependency."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError(
                "log.tensorboard = true needs the tensorboard package: "
                "pip install 'agentrl[tensorboard]' (or set log.tensorboard = false)"
            ) from None
        self._writer = SummaryWriter(str(log_dir))

    def write(self, metrics: dict[str, Any]) -> None:
        """Add each int/float figure as a scalar."""
        step = int(metrics.get("step", 0))
        for key, value in numeric_figures(metrics).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Close the writer."""
        self._writer.close()


class LiveDisplay:
    """A rich panel redrawn every step: reward overall and per environment, phase times, ETA."""

    def __init__(self, num_steps: int, first_step: int = 0, console: Any = None) -> None:
        """``first_step``: steps already done (resume), so the ETA counts only what is left."""
        from rich.console import Console
        from rich.live import Live

        self.num_steps = num_steps
        self.first_step = first_step
        self.console = console or Console()
        self._start = time.monotonic()
        self._live = Live(console=self.console, auto_refresh=False, transient=False)
        self._live.start()

    def write(self, metrics: dict[str, Any]) -> None:
        """Redraw with the latest step."""
        self._live.update(self.render(metrics), refresh=True)

    def render(self, metrics: dict[str, Any]) -> Any:
        """The panel for one step's figures."""
        from rich.table import Table

        step = int(metrics.get("step", 0))
        elapsed = time.monotonic() - self._start
        done = max(step - self.first_step, 1)
        eta = elapsed / done * (self.num_steps - step)
        table = Table(title=f"step {step}/{self.num_steps} · ETA {_duration(eta)}",
                      show_header=True, title_justify="left")
        table.add_column("environment")
        table.add_column("reward", justify="right")
        table.add_column("rollouts", justify="right")
        table.add_column("eval acc", justify="right")
        table.add_row("all", _fmt(metrics.get("reward/mean")),
                      _fmt(metrics.get("num_rollouts")), "")
        for name in env_names(metrics):
            table.add_row(
                name,
                _fmt(metrics.get(f"env/{name}/reward/mean")),
                _fmt(metrics.get(f"env/{name}/num_rollouts")),
                _fmt(metrics.get(f"eval/{name}/accuracy")),
            )
        phases = "  ".join(
            f"{k[5:]} {metrics[k]:.1f}s" for k in sorted(metrics) if k.startswith("time/")
        )
        table.caption = f"{phases}  ·  loss {_fmt(metrics.get('loss/policy_loss'))}"
        return table

    def close(self) -> None:
        """Stop redrawing (the last panel stays on screen)."""
        self._live.stop()


def env_names(metrics: dict[str, Any]) -> list[str]:
    """Environment names present in a metrics dict (from ``env/<name>/...`` keys)."""
    names = {k.split("/")[1] for k in metrics if k.startswith("env/") and k.count("/") >= 2}
    return sorted(names)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    minutes, sec = divmod(seconds, 60)
    return f"{minutes}m{sec:02d}s" if minutes else f"{sec}s"


class MultiWriter:
    """Fans one step's figures out to several writers."""

    def __init__(self, writers: list[MetricWriter]) -> None:
        """Keep the writers in order (the JSONL record first)."""
        self.writers = writers

    def write(self, metrics: dict[str, Any]) -> None:
        """Write to each writer."""
        for writer in self.writers:
            writer.write(metrics)

    def write_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """A step's sampled rollouts as a table, to the writers that keep tables."""
        for writer in self.writers:
            if hasattr(writer, "write_samples"):
                writer.write_samples(step, columns, rows)

    def close(self) -> None:
        """Close each writer."""
        for writer in self.writers:
            writer.close()


def build_writers(
    run_dir: str | Path,
    num_steps: int,
    live: bool,
    tensorboard: bool,
    resume_step: int | None = None,
) -> MultiWriter:
    """The writers a run asked for: JSONL always, live display and TensorBoard optionally."""
    run_dir = Path(run_dir)
    writers: list[MetricWriter] = [JsonlWriter(run_dir / METRICS_FILE, resume_step)]
    if live:
        writers.append(LiveDisplay(num_steps, first_step=resume_step or 0))
    if tensorboard:
        writers.append(TensorBoardWriter(run_dir / "tensorboard"))
    return MultiWriter(writers)

"""``log.wandb`` and ``log.mlflow``: an offline W&B run and a local MLflow store hold the
figures of ``metrics.jsonl`` at the same steps (per environment included), the run
config and the rollout samples as tables; read back with W&B's own reader (``wandb leet
inspect``) and MLflow's client. ``plan`` refuses a tracker whose package is missing (the
one-line error itself: tests/env/test_optional_extras.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agentrl.cli import main
from agentrl.config import MlflowConfig, WandbConfig
from agentrl.observe.mlflow_writer import metric_key
from agentrl.observe.writers import read_metrics
from agentrl.transcripts.store import read_step
from tests.ecosystem.tiny import TINY_BATCH

CONFIG = TINY_BATCH + """
[rollout]
max_new_tokens = 16
max_turns = 2
[train]
num_steps = 2
eval_every = 2
eval_tasks_per_env = 2
[log]
live = false
wandb = { project = "agentrl-test", mode = "offline", tags = ["ci"] }
mlflow = { experiment = "agentrl-test" }
[[environments]]
id = "agentrl/Countdown-v0"
[[environments]]
id = "agentrl/Calculator-v0"
name = "calc"
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("tracked")
    (where / "c.toml").write_text(CONFIG)
    assert main(["train", str(where / "c.toml"), "--out", str(where / "run")]) == 0
    return where / "run"


def figures(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl's numbers per step (null: a non-finite figure, not logged)."""
    return {m["step"]: {k: v for k, v in m.items() if k != "step" and v is not None
                        and isinstance(v, int | float)} for m in read_metrics(run_dir)}


def wandb_records_of(folder: Path) -> list[dict]:
    """A W&B run folder's records, read by W&B's own reader."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                          str(folder)], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_records(run_dir: Path) -> list[dict]:
    return wandb_records_of(run_dir / "wandb" / "latest-run")


def test_wandb_holds_the_figures_the_config_and_the_samples(run_dir):
    records = wandb_records(run_dir)
    history = {r["history"]["step"].get("num", 0): r["history"]["item"]
               for r in records if r["type"] == "history"}
    expected = figures(run_dir)
    assert sorted(history) == sorted(expected) == [0, 1, 2]
    for step, numbers in expected.items():
        logged = {k: v for k, v in history[step].items() if k in numbers}
        assert logged == pytest.approx(numbers), f"step {step}"
        assert set(numbers) <= set(history[step])
    assert "env/calc/reward/mean" in history[1] and "eval/calc/accuracy" in history[2]
    [run] = [r["run"] for r in records if r["type"] == "run"]
    config = run["config"]["update"]
    assert config["train"]["num_steps"] == 2 and config["environments"][1]["name"] == "calc"
    table_file = run_dir / "wandb" / "latest-run" / "files" / history[1]["rollouts.path"]
    table = json.loads(table_file.read_text())
    sampled = read_step(run_dir, 1)
    assert [row[1] for row in table["data"]] == [r.env for r in sampled]
    assert [row[3] for row in table["data"]] == [r.reward for r in sampled]
    assert "[user]" in table["data"][0][table["columns"].index("transcript")]


def test_mlflow_holds_the_figures_the_config_and_the_samples(run_dir):
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve()}/mlflow.db")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    expected = figures(run_dir)
    keys = {key for numbers in expected.values() for key in numbers}
    assert {metric_key(k) for k in keys} == set(run.data.metrics)
    for key in keys:
        history = {m.step: m.value for m in client.get_metric_history(run_id, metric_key(key))}
        assert history == pytest.approx({s: n[key] for s, n in expected.items() if key in n})
    assert run.data.params["train.num_steps"] == "2"
    assert client.get_experiment(run.info.experiment_id).name == "agentrl-test"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.json", "rollouts"} <= artifacts
    local = Path(client.download_artifacts(run_id, "rollouts/step_000002.json",
                                           str(run_dir / "downloaded")))
    table = json.loads(local.read_text())
    assert table["columns"][:2] == ["step", "env"]
    assert [row[1] for row in table["data"]] == [r.env for r in read_step(run_dir, 2)]


def test_plan_refuses_a_tracker_that_is_not_installed(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    (tmp_path / "c.toml").write_text(CONFIG)
    assert main(["plan", str(tmp_path / "c.toml")]) == 2
    assert ("log.wandb needs the wandb package, which is not installed: pip install "
            "'agentrl[wandb]'") in capsys.readouterr().err


def test_a_resumed_run_logs_to_the_same_runs(tmp_path):
    from agentrl.observe.mlflow_writer import MlflowWriter
    from agentrl.observe.wandb_writer import WandbWriter

    settings = (WandbConfig(project="p", mode="offline"), MlflowConfig())
    for resume, steps in ((False, [1, 2]), (True, [3])):
        writers = [WandbWriter(settings[0], tmp_path, {"a": 1}, resume),
                   MlflowWriter(settings[1], tmp_path, {"a": 1}, resume)]
        for step in steps:
            for writer in writers:
                writer.write({"step": step, "reward/mean": step / 10})
        for writer in writers:
            writer.close()
    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    # one run id in both folders (wandb appends "-1" when both start within one second)
    assert len(folders) == 2 and all(re.search(rf"-{run_id}(-\d+)?$", f.name) for f in folders)
    logged = [[r["history"]["step"]["num"] for r in wandb_records_of(f) if r["type"] == "history"]
              for f in folders]
    assert logged == [[1, 2], [3]]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve()}/mlflow.db")
    mlflow_id = (tmp_path / "mlflow_run_id").read_text().strip()
    history = client.get_metric_history(mlflow_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert client.get_run(mlflow_id).info.status == "FINISHED"

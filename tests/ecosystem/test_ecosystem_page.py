"""docs/ecosystem.md, run: every command of its bash blocks and every
``<!-- run: python -->`` block, in order, in an empty folder (``examples`` linked from the
repository, port 8123 replaced by a free one, ``pip install`` into a folder of its own,
training cut to two steps of 16 new tokens a turn). The page ends with the run that mixes
an OpenEnv server agentrl started, a SkyRL-Gym environment, an agentrl environment served
over OpenEnv and trained through OpenEnv's own client, and a built-in, by weight: each
gets its share of every collection, every rollout is valid, and W&B and MLflow hold its
figures."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from agentrl.envs.adapters.openenv_launch import free_port
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "ecosystem.md"
SMALL = {"train": ["--set", "train.num_steps=2", "--set", "rollout.max_new_tokens=16",
                   "--set", "log.live=false"]}
"""What a command gets appended to run in a test's time."""


def page_files(text: str) -> dict[str, str]:
    return dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S))


def page_steps(text: str) -> list[tuple[str, str]]:
    """("bash", line) and ("python", code) in page order."""
    steps = []
    for match in re.finditer(r"(<!-- run: python -->\n)?```(bash|python)\n(.*?)```", text, re.S):
        marked, kind, body = match.groups()
        if kind == "bash":
            steps += [("bash", line.strip()) for line in body.splitlines() if line.strip()]
        elif marked:
            steps.append(("python", body))
    return steps


def test_the_page_covers_each_part():
    commands = [line for kind, line in page_steps(PAGE.read_text()) if kind == "bash"]
    assert any(c.startswith("agentrl serve-env") for c in commands)
    assert any(c.startswith("agentrl check-env http://") for c in commands)
    assert any("skyrl/gsm8k_multi_turn" in c for c in commands)
    assert any("openenv/echo_env" in c for c in commands)
    assert commands[-2].startswith("agentrl train mixed.toml")


@pytest.mark.slow
def test_the_page_runs_and_its_mixed_run_trains(tmp_path):
    port = str(free_port())
    text = PAGE.read_text().replace("8123", port)
    for name, content in page_files(text).items():
        (tmp_path / name).write_text(content)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "WANDB_SILENT": "true",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    background = []
    try:
        for kind, step in page_steps(text):
            if kind == "python":
                run([sys.executable, "-c", step], tmp_path, env)
                continue
            argv = shlex.split(step.removesuffix("&"))
            if argv[0] == "agentrl":
                argv = [sys.executable, "-m", "agentrl.cli", *argv[1:], *SMALL.get(argv[1], [])]
            if argv[:2] == ["pip", "install"]:
                argv = [sys.executable, "-m", "pip", *argv[1:], "--target", str(site)]
            if step.endswith("&"):
                background.append(subprocess.Popen(argv, cwd=tmp_path, env=env,
                                                   stdout=subprocess.DEVNULL))
                wait_for_health(f"http://127.0.0.1:{port}")
            else:
                run(argv, tmp_path, env)
        check_the_mixed_run(tmp_path / "runs" / "mixed")
    finally:
        for proc in background:
            proc.terminate()
            proc.wait(timeout=30)


def run(argv: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"`{shlex.join(argv)}` failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_for_health(url: str) -> None:
    from agentrl.envs.adapters.openenv_launch import wait_healthy

    wait_healthy(url, None, 120)


def check_the_mixed_run(run_dir: Path) -> None:
    steps = [m for m in read_metrics(run_dir) if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2]
    shares = {"echo": 2, "gsm8k": 2, "calculator": 2, "Countdown-v0": 4}  # weights 1:1:1:2
    for metrics in steps:
        for name, rollouts in shares.items():
            assert metrics[f"env/{name}/num_rollouts"] == rollouts, (name, metrics)
        assert metrics["num_invalid_rollouts"] == 0
        assert metrics["env/echo/reward/mean"] > 0  # the echo server's reward, scaled
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve()}/mlflow.db")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    for name in shares:
        history = client.get_metric_history(run_id, f"env/{name}/reward/mean")
        assert [(m.step, m.value) for m in history] == [
            (m["step"], pytest.approx(m[f"env/{name}/reward/mean"])) for m in steps]
    records = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                              str(run_dir / "wandb" / "latest-run")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    history = [json.loads(r)["history"]["item"] for r in records if '"type":"history"' in r]
    assert [h["env/calculator/num_rollouts"] for h in history] == [2, 2]

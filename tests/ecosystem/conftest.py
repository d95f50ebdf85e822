"""The ecosystem tests run against the real packages (openenv, skyrl-gym, wandb, mlflow):
`pip install -e ".[test,ecosystem]"`. Without them these tests are not collected (the
report header says so); ``.ci/run`` installs them and sets AGENTRL_REQUIRE_ECOSYSTEM=1, so
that there a missing package is an error."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ("openenv", "skyrl_gym", "wandb", "mlflow")
MISSING = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
ROOT = Path(__file__).resolve().parents[2]

if MISSING and os.environ.get("AGENTRL_REQUIRE_ECOSYSTEM") == "1":
    raise RuntimeError(f"AGENTRL_REQUIRE_ECOSYSTEM=1 but {', '.join(MISSING)} are not installed")


collect_ignore_glob = ["test_*.py"] if MISSING else []

for _name, _value in {"DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
                      "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
                      "WANDB_MODE": "offline"}.items():
    os.environ.setdefault(_name, _value)  # no usage reports, no hub: nothing leaves here


def pytest_report_header(config):
    if MISSING:
        return (f"tests/ecosystem not run: {', '.join(MISSING)} not installed (pip install -e "
                "'.[ecosystem]'; .ci/run does)")
    return None


@pytest.fixture(scope="session")
def echo_env_dir(tmp_path_factory) -> Path:
    """OpenEnv's own environment template (``openenv init echo_env``), allowing 16
    concurrent sessions (the template's app.py says to raise it for that)."""
    where = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "--output-dir",
                    str(where)], check=True, capture_output=True)
    app = where / "echo_env" / "server" / "app.py"
    app.write_text(app.read_text().replace("max_concurrent_envs=1,", "max_concurrent_envs=16,"))
    return where / "echo_env"


@pytest.fixture(scope="session")
def serve_env():
    """Start ``agentrl serve-env ARGS --port 0``; returns its URL (stopped at the end)."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve-env", *args,
                                 "--host", "127.0.0.1", "--port", "0"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("agentrl serve-env:"):
                return line.split(" on ", 1)[1].split()[0]
        raise RuntimeError("agentrl serve-env did not start:\n" + "".join(lines[-30:]))

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)

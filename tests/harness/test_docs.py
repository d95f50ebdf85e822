"""docs/harnesses.md, run: its example files are the repository's, its `agentrl` commands
run in order on a small scale (the program trained alone, then mixed by weight with a
built-in environment in one run), and its `agentrl serve` block runs the example agent
against the served endpoint. Scaling down only appends options (argparse and ``--set``
take the last value given)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.observe.writers import read_metrics
from tests.test_walkthrough import doc_commands, doc_files

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "harnesses.md"
EXAMPLE = ROOT / "examples" / "harness"
SMALL = ["--set", "train.num_steps=1", "--set", "batch.rollout_batch_size=4",
         "--set", "batch.n_samples_per_prompt=2", "--set", "batch.global_batch_size=8"]
"""One step of 4 groups x 2 rollouts (the mix's 3 : 1 still splits the 4 groups)."""


def test_the_example_files_are_the_pages_files() -> None:
    files = doc_files(DOC.read_text())
    assert set(files) == {"calc_agent.py", "calc_agent.toml"}
    for name, text in files.items():
        assert (EXAMPLE / name).read_text() == text, f"{name} differs from the page's"


def test_the_pages_commands_run(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)  # the page's paths are the repository's
    commands = [c for c in doc_commands(DOC.read_text()) if c[0] != "serve"]
    assert [c[0] for c in commands] == ["plan", "train", "inspect", "train"]
    outs: list[Path] = []
    for command in commands:
        if "--out" in command:  # runs go to this test's folder
            index = command.index("--out") + 1
            command[index] = str(tmp_path / Path(command[index]).name)
            outs.append(Path(command[index]))
        if command[0] == "inspect":
            command = ["inspect", str(outs[-1])]
        assert main(command + (SMALL if command[0] == "train" else [])) == 0, command
    printed = capsys.readouterr().out
    assert "harnesses: calc_agent runs" in printed  # plan checked the program
    alone, mixed = (read_metrics(out)[0] for out in outs)
    assert alone["env/calc_agent/num_rollouts"] == 8 and alone["num_trainable_tokens"] > 0
    # by weight 3 : 1 in one run: 3 of the 4 groups are the program's
    assert mixed["env/calc_agent/num_groups"] == 3 and mixed["env/countdown/num_groups"] == 1
    assert mixed["env/calc_agent/num_trainable_tokens"] > 0
    assert mixed["env/countdown/num_trainable_tokens"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_block_runs_the_agent_against_agentrl_serve() -> None:
    block = next(b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
                 if "agentrl serve" in b)
    port = str(_free_port())
    lines = block.replace("8000", port).replace("\\\n", " ").strip().splitlines()
    serve = shlex.split(lines[0])
    assert serve[:2] == ["agentrl", "serve"]
    server = subprocess.Popen([sys.executable, "-m", "agentrl", *serve[1:]], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(server, port)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        agent = subprocess.run(["bash", "-c", lines[1]], cwd=ROOT, env=env, text=True,
                               capture_output=True, timeout=300)
        assert agent.returncode == 0, agent.stderr
        session = subprocess.run(["bash", "-c", lines[2]], cwd=ROOT, text=True,
                                 capture_output=True, timeout=60)
        described = json.loads(session.stdout)
        assert described["session"] == "try-1" and described["num_drift"] == 0
        rows = described["threads"][0]["rows"]
        assert len(rows) == 1 and rows[0]["num_generated_tokens"] > 0  # one row, no drift
    finally:
        server.terminate()
        server.wait(30)


def _wait_for(server: subprocess.Popen, port: str) -> None:
    deadline = time.monotonic() + 600  # importing torch alone took 57 s on a busy machine
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"agentrl serve exited: {server.stdout.read()}")
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail("agentrl serve did not listen in time")

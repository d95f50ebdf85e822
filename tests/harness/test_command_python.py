"""One rule for ``python`` in every command agentrl starts (a harness's command line and
an OpenEnv server's), and a sandboxed command whose interpreter the sandbox's user cannot
read is refused by ``plan`` beforehand, naming the symlink and its target."""

from __future__ import annotations

import os
import sys

import pytest

from agentrl.config import ConfigError
from agentrl.envs.adapters.openenv_launch import command_argv
from agentrl.rollout.harness_episode import _command_line
from agentrl.sandbox.interpreter import NOBODY
from agentrl.train.preflight import run_checks
from agentrl.train.preflight_parts import check_harnesses
from tests.harness.conftest import harness_config


@pytest.mark.parametrize("name", ["python", "python3"])
def test_python_is_agentrls_interpreter_in_both_kinds_of_command(tmp_path, name):
    config = harness_config(tmp_path, {"command": [name, "agent.py"]})
    harness = config.environments[0].harness
    argv, _, _ = _command_line(harness, {}, {"base_url": "u", "api_key": "k", "model": "m"},
                               None, str(tmp_path))
    assert argv == [sys.executable, "agent.py"]
    assert command_argv([name, "server.py", "{port}"], 8123) == [sys.executable, "server.py",
                                                                   "8123"]
    assert command_argv(["uvicorn", "{port}"], 1)[0] == "uvicorn"  # only python is mapped


def test_plan_names_a_symlinked_interpreter_the_sandbox_cannot_read(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "python3.11").write_text("")
    os.chmod(locked / "python3.11", 0o755)
    (tmp_path / "python").symlink_to(locked / "python3.11")
    monkeypatch.setattr("agentrl.sandbox.program.host_uid", lambda: NOBODY)
    command = {"command": [str(tmp_path / "python"), "agent.py"], "cwd": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        run_checks(harness_config(tmp_path, {**command, "sandbox": True}), [check_harnesses])
    (line,) = str(info.value).splitlines()
    assert f"{tmp_path / 'python'} is a symlink to {locked / 'python3.11'}" in line
    assert f"uid {NOBODY} cannot read" in line and "PermissionError" in line
    assert run_checks(harness_config(tmp_path, command), [check_harnesses])  # no sandbox

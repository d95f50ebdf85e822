"""An environment (or harness program) given as "file.py:name" sees its own folder, as
Python does for a script, and an import it cannot make is one line naming the file, its
line and the missing module: in check-env, plan (before the batch plan) and train."""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.envs.registry import load_object, resolve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder of user files whose sibling module has a name no other test uses; the
    import path and module cache are restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    lib = f"mylib_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{lib}.py").write_text("WORDS = ('sibling',)\n\ndef answer(task, config):\n"
                                        "    return 'from the sibling'\n")
    shutil.copy(ROOT / "examples" / "custom_env" / "reverse_word.py", tmp_path)
    (tmp_path / "env.py").write_text(
        f"from {lib} import WORDS\nfrom reverse_word import ReverseWordEnv\n\n\n"
        "class SiblingEnv(ReverseWordEnv):\n"
        "    def __init__(self, **kwargs):\n        super().__init__(words=WORDS, **kwargs)\n")
    (tmp_path / "agent.py").write_text(f"from {lib} import answer as run\n")
    (tmp_path / "broken.py").write_text("import json\nfrom not_installed_anywhere import x\n")
    yield tmp_path
    for name in [lib, "reverse_word"]:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_file_environment_imports_its_siblings(folder):
    cls = resolve(f"{folder / 'env.py'}:SiblingEnv")
    env = cls()
    messages, _ = env.reset(seed=0)
    assert messages[-1].content == "Word: sibling"


def test_a_harness_file_imports_its_siblings(folder):
    run = load_object(f"{folder / 'agent.py'}:run", "harness.run")
    assert run({}, {}) == "from the sibling"


def test_an_import_error_is_one_line_naming_the_file_and_module(folder):
    with pytest.raises(ValueError) as info:
        resolve(f"{folder / 'broken.py'}:Env")
    message = str(info.value)
    assert "\n" not in message
    assert f"{folder / 'broken.py'}, line 2" in message
    assert "'not_installed_anywhere'" in message


def test_check_env_prints_the_one_line(folder, capsys):
    assert main(["check-env", f"{folder / 'broken.py'}:Env"]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "not_installed_anywhere" in out and "broken.py" in out


@pytest.mark.parametrize("section", ["id", "harness"])
def test_plan_says_so_before_its_batch_plan(folder, capsys, section):
    env = ('id = "broken.py:Env"' if section == "id" else
           'id = "agentrl/Countdown-v0"\nharness = { run = "broken.py:run" }')
    (folder / "run.toml").write_text(f"[[environments]]\n{env}\n")
    assert main(["plan", str(folder / "run.toml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no batch plan printed first
    (line,) = captured.err.splitlines()
    assert "broken.py, line 2" in line and "not_installed_anywhere" in line


def test_train_stops_on_the_one_line(folder, capsys):
    (folder / "run.toml").write_text('[[environments]]\nid = "broken.py:Env"\n')
    assert main(["train", str(folder / "run.toml"), "--out", str(folder / "run")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "broken.py, line 2" in line and "not_installed_anywhere" in line

"""The environment author's small things: clear errors and warnings, registration without
Python code (plugin entry points), and Gymnasium seeing the built-ins after install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.envs import AgentEnv, Task
from agentrl.envs.registry import make
from agentrl.envs.tools import format_call, tool
from agentrl.types import Message

ROOT = Path(__file__).resolve().parents[2]


class ForgotSuperEnv(AgentEnv):
    """A subclass whose __init__ never calls AgentEnv.__init__."""

    def __init__(self, size: int = 3, **kwargs):
        self.size = size

    def sample_task(self, rng):
        return Task([Message("user", "hi")], key="hi")


def test_a_tool_without_docstring_warns_naming_it():
    with pytest.warns(UserWarning, match="tool lookup_thing: no docstring"):
        class Undocumented(AgentEnv):
            @tool
            def lookup_thing(self, key: str) -> str:
                return key
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a documented tool is quiet

        class Documented(AgentEnv):
            @tool
            def lookup_thing(self, key: str) -> str:
                """Look a key up."""
                return key
    assert Documented.lookup_thing.__agentrl_tool__.description == "Look a key up."


def test_forgetting_super_init_names_the_fix():
    fix = r"ForgotSuperEnv.__init__ did not call super\(\).__init__\(\*\*kwargs\)"
    with pytest.raises(ValueError, match=fix):
        make("tests.env.test_env_authoring:ForgotSuperEnv")
    env = ForgotSuperEnv()
    with pytest.raises(TypeError, match=fix):  # not an AttributeError deep inside
        env.tool_schemas()
    from gymnasium.utils.env_checker import check_env

    with pytest.raises(TypeError, match=fix):
        check_env(env)


def test_check_env_cli_says_how_to_fix_a_missing_super_init(capsys):
    assert main(["check-env", "tests.env.test_env_authoring:ForgotSuperEnv"]) == 1  # raised
    assert "add `super().__init__(**kwargs)`" in capsys.readouterr().out


def test_format_call_is_what_the_parser_reads():
    from agentrl.envs.tools import HermesParser, ToolCall

    text = format_call("grep", pattern="ERROR", name="x")  # an argument may be called name
    assert HermesParser().parse(text) == [ToolCall("grep", {"pattern": "ERROR", "name": "x"})]
    assert text == '<tool_call>\n{"name": "grep", "arguments": {"pattern": "ERROR", ' \
                   '"name": "x"}}\n</tool_call>'


def run_python(code: str, extra_path: list[str] | None = None) -> subprocess.CompletedProcess:
    """A clean interpreter (nothing imported), from a neutral folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(extra_path or []), str(ROOT)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd="/", env=env, timeout=120)


def test_gymnasium_makes_the_builtins_in_a_clean_interpreter():
    result = run_python("""
        import gymnasium
        env = gymnasium.make("agentrl:agentrl/Countdown-v0")  # gymnasium imports agentrl
        print(type(env.unwrapped).__name__)
        import agentrl
        print(type(gymnasium.make("agentrl/Calculator-v0").unwrapped).__name__)
        import importlib.metadata as md
        print([e.value for e in md.entry_points(group="gymnasium.envs") if e.name == "agentrl"])
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == [
        "CountdownEnv", "CalculatorEnv", "['agentrl.envs.registry:register_builtins']"]


def test_an_installed_package_registers_ids_by_entry_point_alone(tmp_path):
    # what `pip install` of a package with [project.entry-points."gymnasium.envs"] leaves
    dist = tmp_path / "myproject-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myproject\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[gymnasium.envs]\n"
        "myproject/Reverse-v0 = examples.custom_env.reverse_word:ReverseWordEnv\n"
        "broken = no_such_module:register\n")
    result = run_python("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import agentrl
        import gymnasium
        from agentrl.envs.registry import make
        print(type(gymnasium.make("myproject/Reverse-v0").unwrapped).__name__)
        env = make("myproject/Reverse-v0", max_turns=2)
        print(env.max_turns, [str(w.message)[:40] for w in caught])
    """, [str(tmp_path)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "ReverseWordEnv"
    assert lines[1] == "2 ['gymnasium.envs plugin broken = no_such_m']"


def test_a_file_id_resolves_beside_its_config(tmp_path, monkeypatch):
    from agentrl.config import load_config

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "reverse.py").write_text((ROOT / "examples/custom_env/reverse_word.py").read_text())
    (folder / "mix.toml").write_text('[[environments]]\nid = "reverse.py:ReverseWordEnv"\n')
    monkeypatch.chdir(tmp_path)  # not the config's folder
    env_id = load_config(folder / "mix.toml").environments[0].id
    assert env_id == f"{folder / 'reverse.py'}:ReverseWordEnv"
    assert make(env_id).reset(seed=0)[0][-1].content.startswith("Word: ")
    monkeypatch.chdir(folder)  # from its folder the id stays as written
    assert load_config("mix.toml").environments[0].id == "reverse.py:ReverseWordEnv"

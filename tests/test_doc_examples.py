"""Every environment an author can copy passes ``agentrl check-env``: each Python code block
of every docs page (docs/*.md, README.md, examples' READMEs) that defines an ``AgentEnv``
subclass, written to a folder beside that page's other ``<!-- file: NAME -->`` blocks (a
block may import one, as the subagent example imports ``logsearch``), and each
environment class of the example files under ``examples/``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.envs.agent_env import AgentEnv
from agentrl.envs.registry import load_object

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("examples/**/*.md")])
BLOCK = re.compile(r"(?:<!-- file: (\S+) -->\n)?```python\n(.*?)```", re.S)
CLASS = re.compile(r"^class (\w+)\(", re.M)


def page_blocks(text: str) -> list[tuple[str, str]]:
    """(file name, code) of a page's Python blocks: a ``<!-- file: -->`` block under its
    name, any other under ``example_N.py`` (N its place on the page)."""
    return [(name or f"example_{n}.py", code)
            for n, (name, code) in enumerate(BLOCK.findall(text))]


def example_cases() -> list[tuple[str, str, str]]:
    """(page or folder, file name, class name) of every class a page block or an example
    file defines (whether it is an environment is known only once imported)."""
    cases = []
    for page in PAGES:
        for name, code in page_blocks(page.read_text()):
            cases += [(str(page.relative_to(ROOT)), name, cls) for cls in CLASS.findall(code)]
    for path in sorted(ROOT.glob("examples/**/*.py")):
        cases += [(str(path.parent.relative_to(ROOT)), path.name, cls)
                  for cls in CLASS.findall(path.read_text())]
    return cases


CASES = example_cases()


def test_the_pages_examples_are_found():
    found = {(where, cls) for where, _, cls in CASES}
    assert {("docs/writing-environments.md", "LogSearchEnv"),
            ("docs/writing-environments.md", "DelegatingLogSearchEnv"),
            ("examples/custom_env", "ReverseWordEnv")} <= found
    assert page_blocks("<!-- file: a.py -->\n```python\nx\n```\n```python\ny\n```") == [
        ("a.py", "x\n"), ("example_1.py", "y\n")]


@pytest.mark.parametrize(("where", "name", "cls"), CASES, ids=lambda v: str(v))
def test_every_example_environment_passes_check_env(where, name, cls, tmp_path, monkeypatch,
                                                     capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder a file import adds
    if where.endswith(".md"):
        for file, code in page_blocks((ROOT / where).read_text()):
            (tmp_path / file).write_text(code)
            monkeypatch.delitem(sys.modules, file.removesuffix(".py"), raising=False)
        folder = tmp_path
    else:
        folder = ROOT / where
    target = f"{folder / name}:{cls}"
    if not (isinstance(found := load_object(target, where), type)
            and issubclass(found, AgentEnv)):
        return  # a helper class, not an environment
    status = main(["check-env", target])
    out = capsys.readouterr().out
    assert status == 0, f"{where}: check-env {name}:{cls} failed:\n{out[-3000:]}"
    assert "gymnasium check_env: passed" in out

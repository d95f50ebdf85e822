"""The package layout keeps its direction: imports run from commands down to config.

One unit per stage (a package, or the data plane's top-level files), in layers; a module
may import its own unit and the units of lower layers, never a unit of its own layer or
above. Every import counts, also the ones inside functions: a lazy import against the
direction is still a dependency. docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[str, ...]] = [
    ("config",),
    ("base",),  # types.py, text.py: messages, segments, rollouts, rows
    ("model", "sandbox"),
    ("data plane", "parallel"),
    ("envs", "observe"),
    ("engines", "curriculum"),
    ("rollout", "memory"),
    ("transcripts",),
    ("train",),
    ("commands",),
    ("cli",),
]
"""Lowest first."""

PACKAGES = {"config", "envs", "engines", "rollout", "train", "observe", "model", "parallel",
            "memory", "sandbox", "transcripts", "commands", "curriculum"}
BASE = {"types", "text"}
DATA_PLANE = {"sampler", "reassembler", "advantage", "packing", "collate_speed",
              "shared_prefix", "loss", "staleness"}
ALIASES = {"env": "envs", "tools": "envs"}
"""Stable one-line re-exports of the old paths (``agentrl.env``, ``agentrl.tools``)."""
ENTRY = {"cli": "cli", "__main__": "cli"}

ENVIRONMENTS_MAY_IMPORT = {"config", "base", "sandbox", "envs"}
"""The built-in environments are written like any author's: against the public API."""


def unit_of(module: str) -> str | None:
    """The layout unit of an ``agentrl...`` module name (None for the package facade)."""
    parts = module.split(".")
    if parts[0] != "agentrl":
        return None
    if len(parts) == 1:
        return None  # agentrl/__init__.py: the lazy facade of public names
    head = parts[1]
    if head in PACKAGES:
        return head
    if head in BASE:
        return "base"
    if head in DATA_PLANE:
        return "data plane"
    if head in ALIASES:
        return ALIASES[head]
    if head in ENTRY:
        return ENTRY[head]
    raise AssertionError(f"agentrl.{head} belongs to no layout unit: add it to a layer in "
                         "tests/test_layout.py and to docs/architecture.md")


def layer_of(unit: str) -> int:
    """The layer index of a unit (0 = lowest)."""
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"unit {unit!r} is in no layer")


def module_name(path: Path) -> str:
    """``agentrl/rollout/runner.py`` → ``agentrl.rollout.runner``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import in a file, function-level ones included;
    ``from a import b`` yields ``a.b`` too, since ``b`` may be a module."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(paths: list[Path]) -> list[str]:
    """Every import of an agentrl module against the layers, one line each."""
    out = []
    for path in paths:
        here = unit_of(module_name(path))
        if here is None:
            continue
        for line, target in imports_of(path):
            there = unit_of(target) if target.startswith("agentrl.") else None
            if there is None or there == here:
                continue
            if layer_of(there) >= layer_of(here):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {target}: {here!r} "
                           f"(layer {layer_of(here)}) may not import {there!r} (layer "
                           f"{layer_of(there)}); move the shared code to a lower layer")
    return out


def test_every_agentrl_import_runs_down_the_layers() -> None:
    paths = sorted((ROOT / "agentrl").rglob("*.py"))
    assert len(paths) > 50
    assert violations(paths) == []


def mutual_imports(paths: list[Path]) -> list[tuple[str, str]]:
    """Pairs of agentrl modules that import each other (lazy imports count)."""
    modules = {module_name(p): p for p in paths}
    graph = {m: {t for _, t in imports_of(p) if t in modules and t != m}
             for m, p in modules.items()}
    return sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph[b]})


def test_no_two_modules_import_each_other() -> None:
    assert mutual_imports(sorted((ROOT / "agentrl").rglob("*.py"))) == []


def test_built_in_environments_use_only_the_authors_api() -> None:
    bad = []
    for path in sorted((ROOT / "environments").rglob("*.py")):
        for line, target in imports_of(path):
            unit = unit_of(target) if target.startswith("agentrl.") else None
            if unit is not None and unit not in ENVIRONMENTS_MAY_IMPORT:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert bad == []


@pytest.mark.parametrize("source, target", [
    ("agentrl/envs/agent_env.py", "agentrl.train.trainer"),
    ("agentrl/engines/router.py", "agentrl.rollout.runner"),
    ("agentrl/train/run.py", "agentrl.commands.train"),
    ("agentrl/rollout/collector_process.py", "agentrl.train.run"),
    ("agentrl/config/settings.py", "agentrl.types"),
    ("agentrl/observe/metrics.py", "agentrl.envs.registry"),  # same layer, other unit
])
def test_an_import_against_the_direction_is_reported(tmp_path: Path, source: str,
                                                     target: str) -> None:
    # the check itself can fail: a copy of a real module with one wrong import added
    fake = ROOT / source
    text = fake.read_text() + f"\n\ndef _late():\n    import {target}  # noqa\n"
    copy = fake.with_name("_layout_probe.py")
    copy.write_text(text)
    try:
        found = violations([copy])
    finally:
        copy.unlink()
    assert len(found) == 1 and target in found[0], found


def test_every_package_says_its_job_in_one_line() -> None:
    for init in sorted((ROOT / "agentrl").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        assert len(doc.splitlines()[0]) <= 100, init

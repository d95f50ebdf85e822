"""Every TOML in configs/ and examples/ parses, validates and plans."""

from pathlib import Path

import pytest

from agentrl.accounting import plan_batches
from agentrl.cli import main
from agentrl.config import load_config

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*ROOT.glob("configs/**/*.toml"), *ROOT.glob("examples/**/*.toml")])


def test_there_are_shipped_configs():
    assert SHIPPED, "configs/ should ship at least one recipe"


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_shipped_config_is_valid(path, capsys):
    config = load_config(path)
    assert plan_batches(config).num_updates >= 1
    assert main(["plan", str(path)]) == 0
    assert "rollouts" in capsys.readouterr().out

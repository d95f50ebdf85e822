"""Every TOML in configs/ and examples/ parses, validates, plans and passes the plan-time
checks (with local stand-ins for the model folders and data files a GPU recipe names)."""

import json
import re
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.config.accounting import plan_batches

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*ROOT.glob("configs/**/*.toml"), *ROOT.glob("examples/**/*.toml")])
QWEN25_POSITIONS = 32768  # max_position_embeddings of the Qwen2.5 checkpoints the recipes name
GSM8K_SAMPLE = ROOT / "environments" / "data" / "gsm8k_sample.jsonl"


def test_there_are_shipped_configs():
    assert SHIPPED, "configs/ should ship at least one recipe"


def _exists(path: str) -> bool:
    return Path(path).exists() or (ROOT / path).exists()


@pytest.fixture(scope="module")
def stand_in_model(tmp_path_factory) -> Path:
    """A tiny checkpoint with the recipes' model's positions."""
    from agentrl.model import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("qwen") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300,
                                 max_position_embeddings=QWEN25_POSITIONS)


def warm_start_stand_in(config, folder: Path, recipe: str) -> Path:
    """What `agentrl sft` writes for a config (its tokenizer: the generic base's when the
    recipe starts from it, else fitted to the environments' demonstrations with the chat
    template the recipe names, so prompts measure as in the walkthrough), untrained."""
    from agentrl.model import build_tiny_checkpoint
    from agentrl.model.base import GENERIC_BASE
    from agentrl.train.sft import WarmStartConfig, tokenizer_corpus

    if re.search(r"agentrl sft \S+ --out", recipe):  # no --base: the generic base's tokens
        return GENERIC_BASE
    defaults = WarmStartConfig()
    named = re.search(r"--chat-template (\S+)", recipe)
    template = named.group(1) if named else defaults.chat_template
    return build_tiny_checkpoint(folder, hidden_size=32, num_layers=1, num_heads=2,
                                 num_kv_heads=1, vocab_size=defaults.vocab_size,
                                 chat_template=template,
                                 corpus=tokenizer_corpus(config, num_rollouts=40,
                                                         chat_template=template))


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_shipped_config_is_valid(path, capsys, stand_in_model, tmp_path):
    config = load_config(path)
    assert plan_batches(config).num_updates >= 1
    absent, overrides = [], []
    if config.model.path and not _exists(config.model.path):
        absent.append(config.model.path)
        # a GPU recipe names a checkpoint; a walkthrough names its own `agentrl sft` output
        model = stand_in_model if config.model.path.startswith("/") else warm_start_stand_in(
            config, tmp_path / "sft", path.read_text())
        overrides.append(f'model.path="{model}"')
    for index, env in enumerate(config.environments):
        missing = {k: v for k, v in env.kwargs.items() if k.endswith("path") and not _exists(v)}
        if missing:  # only GSM8K takes data files: its shipped sample stands in
            absent += missing.values()
            kwargs = {**env.kwargs, **dict.fromkeys(missing, str(GSM8K_SAMPLE))}
            table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in kwargs.items())
            overrides.append(f"environments.{index}.kwargs={{ {table} }}")
    if absent:  # as shipped, plan refuses exactly the files absent here, one line each
        assert main(["plan", str(path)]) == 2
        errors = capsys.readouterr().err.splitlines()
        assert errors and all(any(a in line for a in absent) for line in errors), errors
    assert main(["plan", str(path), *[a for o in overrides for a in ("--set", o)]]) == 0
    out = capsys.readouterr().out
    assert "rollouts" in out and "micro-batch: budget" in out

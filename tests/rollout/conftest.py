"""A tiny Qwen2-style checkpoint, built once per test session (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny") / "ckpt", hidden_size=32, num_layers=2, num_heads=4,
        num_kv_heads=2, vocab_size=400, seed=0,
    )


@pytest.fixture
def tiny_model(tiny_ckpt: Path):
    return load_pretrained(tiny_ckpt, attention="torch").eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_ckpt: Path):
    return load_tokenizer(tiny_ckpt)

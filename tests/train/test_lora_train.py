"""`agentrl train` with ``[model.lora]`` on a tiny model: adapter-only checkpoints in PEFT's
format, an exact resume of adapter and optimizer state, the same adapter on one and two
ranks, the engine in step with the trainer after every adapter-only sync, asynchronous
collection (max_staleness = 1) recording adapter versions, and `agentrl export --merge`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.cli import main
from agentrl.model import load_pretrained
from agentrl.model.peft_format import read_adapter
from tests.train.test_train_e2e import CONFIG, DETERMINISTIC, _metrics, _without_times

LORA_SECTION = "[model.lora]\nrank = 4\nalpha = 8.0\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.model import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def _train(tmp_path, model_dir, name, steps=4, resume=False, overrides=(), eval_every=0):
    config = tmp_path / f"{name}.toml"
    text = CONFIG.format(model=model_dir, budget=4096, steps=steps, eval_every=eval_every)
    config.write_text(text.replace("[batch]", LORA_SECTION + "[batch]"))
    out = tmp_path / name
    argv = ["train", str(config), "--out", str(out)] + (["--resume"] if resume else [])
    argv += [arg for o in overrides for arg in ("--set", o)]
    assert main(argv) == 0
    return out


def _adapter(out, step):
    return read_adapter(out / "checkpoints" / f"step_{step}")


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, model_dir):
    return _train(tmp_path_factory.mktemp("lora"), model_dir, "lora", eval_every=2,
                  overrides=DETERMINISTIC)


def test_checkpoints_hold_the_adapter_alone_and_it_trained(four_steps, model_dir) -> None:
    ckpt = four_steps / "checkpoints" / "step_4"
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer",
            "trainer_state.json", "tokenizer.json"} <= names
    assert "model.safetensors" not in names and "config.json" not in names
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(model_dir)
    stored = load_file(ckpt / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.model.layers.") for k in stored)
    adapter = _adapter(four_steps, 4)
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)
    assert all(v.dtype == torch.float32 for v in adapter.values())


def test_the_engine_serves_the_trainer_adapter_after_every_sync(four_steps) -> None:
    # before a collection's first update the trainer's log-probs equal the engine's up to
    # fp32 rounding: the engine got exactly the trained adapter (adapter-only syncs)
    records = _metrics(four_steps)[1:]
    assert all(r["loss/mismatch_scored"] < 1e-5 for r in records)
    assert any(r["optim/grad_norm"] > 0 for r in records)  # the adapters did move


def test_deterministic_resume_of_adapter_and_optimizer_is_exact(tmp_path, model_dir,
                                                                four_steps) -> None:
    out = _train(tmp_path, model_dir, "split", steps=2, eval_every=2, overrides=DETERMINISTIC)
    config = tmp_path / "split.toml"
    config.write_text(config.read_text().replace("num_steps = 2", "num_steps = 4"))
    assert main(["train", str(config), "--out", str(out), "--resume",
                 "--set", DETERMINISTIC[0]]) == 0
    whole, split = _adapter(four_steps, 4), _adapter(out, 4)
    assert whole.keys() == split.keys()
    for name, tensor in whole.items():
        assert torch.equal(tensor, split[name]), name
    assert [_without_times(r) for r in _metrics(four_steps)] == [
        _without_times(r) for r in _metrics(out)]


def test_a_resume_refuses_an_adapter_of_another_rank(tmp_path, model_dir) -> None:
    out = _train(tmp_path, model_dir, "r4", steps=1)
    with pytest.raises(ValueError, match="rank = 4 but model.lora.rank = 8"):
        _train(tmp_path, model_dir, "r4", steps=2, resume=True,
               overrides=["model.lora.rank=8"])
    assert (out / "checkpoints" / "step_1").is_dir()


def test_two_ranks_train_the_same_adapter_as_one(tmp_path, model_dir) -> None:
    one = _train(tmp_path, model_dir, "one", steps=2)
    two = _train(tmp_path, model_dir, "two", steps=2, overrides=["train.num_ranks=2"])
    a, b = _adapter(one, 2), _adapter(two, 2)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert [r["num_rollouts"] for r in _metrics(two)] == [4, 4]


@pytest.mark.parametrize("collector", ["thread", "process"])
def test_asynchronous_lora_run_records_adapter_versions(tmp_path, model_dir, collector) -> None:
    # the engine takes each adapter as soon as it is published (requests running then
    # finish on theirs): versions still obey the bound, and every token records one
    out = _train(tmp_path, model_dir, "async", steps=4,
                 overrides=["rollout.max_staleness=1", "loss.objective=\"decoupled\"",
                            f"rollout.collector=\"{collector}\""])
    records = _metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["staleness/max"] <= 1 for r in records)
    assert not any("staleness/dropped_rollouts" in r for r in records)  # never discards
    trained = [json.loads(line) for line in (out / "trained_rollouts.jsonl").open()]
    versions = {v for line in trained for rollout in line["rollouts"]
                for _start, v in rollout[3]}
    assert versions <= {0, 1, 2, 3} and len(versions) >= 2


def test_export_merges_the_adapter_into_a_full_model(tmp_path, four_steps, model_dir) -> None:
    transformers = pytest.importorskip("transformers")
    ckpt = four_steps / "checkpoints" / "step_4"
    merged_dir = tmp_path / "merged"
    assert main(["export", str(ckpt), "--out", str(merged_dir), "--merge"]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in merged_dir.iterdir()}
    from agentrl.model.lora import add_adapters
    from agentrl.model.peft_format import read_adapter_config

    lora, _ = read_adapter_config(ckpt)
    adapted = load_pretrained(model_dir)
    add_adapters(adapted, lora)
    adapted.load_state_dict(read_adapter(ckpt), strict=False)
    ids = torch.arange(12)[None]
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    with torch.no_grad():
        ours = adapted(ids)
        torch.testing.assert_close(load_pretrained(merged_dir)(ids), ours, atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(hf(ids).logits, ours, atol=1e-4, rtol=1e-4)
    peft_dir = tmp_path / "adapter"
    assert main(["export", str(ckpt), "--out", str(peft_dir)]) == 0
    assert read_adapter(peft_dir).keys() == read_adapter(ckpt).keys()


def test_eval_runs_a_lora_checkpoint(tmp_path, four_steps, capsys) -> None:
    capsys.readouterr()
    assert main(["eval", str(four_steps.parent / "lora.toml"), "--checkpoint",
                 str(four_steps / "checkpoints" / "step_4"), "--tasks", "2"]) == 0
    assert "mean" in capsys.readouterr().out

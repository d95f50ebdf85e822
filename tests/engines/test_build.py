"""Building the inference side: replica counts and placement, config errors, the memory
share, and a training run over two local replicas that each own their model."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import ConfigError, config_from_dict
from agentrl.engines.build import engine_memory, replica_gpus
from agentrl.engines.vllm_sync import physical_gpus
from agentrl.parallel.fsdp import iter_full_parameters
from agentrl.train.run import build_run
from agentrl.train.trainer import train

ENV = [{"id": "tests.train.test_train_e2e:ShortAnswerEnv"}]


def config(**rollout):
    return config_from_dict({"environments": ENV, "rollout": rollout,
                             "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 2,
                                       "global_batch_size": 4}})


def test_placement_puts_replicas_on_the_training_gpus_or_after_them():
    # 8 GPUs, 4 training: separate replicas of 2 GPUs take 4-5 and 6-7
    assert replica_gpus(0, "separate", 2, 4, 8) == [4, 5]
    assert replica_gpus(1, "separate", 2, 4, 8) == [6, 7]
    assert replica_gpus(3, "colocated", 1, 4, 8) == [3]
    with pytest.raises(ValueError, match=r"replica 2 needs GPUs \[8, 9\] but there are 8 GPUs "
                                         "with 4 training"):
        replica_gpus(2, "separate", 2, 4, 8)
    with pytest.raises(ValueError, match=r"colocated.*replica 2 needs GPUs \[4, 5\].*4 training"):
        replica_gpus(2, "colocated", 2, 4, 8)


def test_gpu_indices_map_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,6,7")
    assert physical_gpus([2, 3]) == "6,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpus([4, 5]) == "4,5"


@pytest.mark.parametrize(("rollout", "message"), [
    ({"num_engines": 0}, "nothing would generate"),
    ({"num_engines": -1}, "num_engines = -1 is out of range"),
    ({"tensor_parallel_size": 2}, 'needs engine = "vllm"'),
    ({"remote_engines": ["10.0.0.2:8000"]}, "'10.0.0.2:8000' is not http://HOST:PORT"),
    ({"remote_engines": ["http://a:1"], "weight_transport": "files"}, "local vLLM replicas"),
    ({"remote_engines": ["http://a:1"], "weight_transport": "ipc"}, "local vLLM replicas"),
    ({"weight_sync_timeout_s": 0}, "weight_sync_timeout_s = 0 is out of range"),
])
def test_engine_settings_that_cannot_run_are_refused(rollout, message):
    with pytest.raises(ConfigError, match=message):
        config(**rollout)


def test_the_memory_share_of_built_in_replicas():
    # 2 replicas colocated; KV: 2 (k, v) × 2 layers × 1 KV head × 16 dims × 4 bytes
    # × 8 slots × (2048 rollout tokens + 2048 for prompt and observations)
    share = engine_memory(config(num_engines=2, max_concurrent_rollouts=8),
                          num_parameters=1000, num_layers=2, num_kv_heads=1, head_dim=16,
                          max_position_embeddings=100_000)
    assert share.num_local_replicas == 2 and share.colocated
    assert share.weight_bytes_per_replica == 4000
    assert share.kv_cache_bytes_per_replica == 2 * 2 * 1 * 16 * 4 * 8 * 4096
    vllm = engine_memory(config(engine="vllm", tensor_parallel_size=2, placement="separate",
                                vllm_args={"gpu_memory_utilization": 0.8}),
                         1000, 2, 1, 16, 100_000)
    assert (vllm.gpus_per_replica, vllm.weight_bytes_per_replica, vllm.colocated,
            vllm.vllm_gpu_memory_fraction) == (2, 2000, False, 0.8)


def test_training_uses_every_local_replica_and_keeps_them_in_step(tmp_path):
    cfg = config_from_dict({
        "environments": ENV,
        "batch": {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "global_batch_size": 8},
        "rollout": {"num_engines": 2, "max_new_tokens": 6, "max_turns": 1},
        "optim": {"lr": 1e-2}, "train": {"num_steps": 2, "seed": 1}, "log": {"live": False},
    })
    run = build_run(cfg, tmp_path / "run")
    replicas = run.engine.replicas
    assert len(replicas) == 2 and all(r.model is not run.model for r in replicas)
    train(run)
    assert all(n > 0 for n in run.engine.num_requests)
    assert [r.weight_version for r in replicas] == [2, 2]
    trained = dict(iter_full_parameters(run.model))
    for replica in replicas:  # each serves the trained weights
        for name, param in trained.items():
            assert torch.equal(replica.model.get_parameter(name), param)
        assert replica.is_sleeping  # colocated (the default): asleep after a collection


def test_serve_needs_a_model_folder(tmp_path, capsys):
    from agentrl.cli import main

    config = tmp_path / "serve.toml"
    config.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n')
    assert main(["serve", str(config), "--port", "0"]) == 2
    assert "agentrl serve needs model.path" in capsys.readouterr().err


def test_vllm_serve_flags_make_vllm_speak_the_protocol(tmp_path):
    from agentrl.commands.serve import vllm_serve_command
    from agentrl.model import build_tiny_checkpoint

    model = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_heads=2, num_kv_heads=1,
                                  vocab_size=300, max_position_embeddings=2048)
    cfg = config_from_dict({"environments": ENV, "model": {"path": str(model)},
                            "rollout": {"engine": "vllm", "tensor_parallel_size": 2,
                                        "placement": "separate",
                                        "vllm_args": {"enforce_eager": True,
                                                      "gpu_memory_utilization": 0.8}}})
    argv, env = vllm_serve_command(cfg, "127.0.0.1", 8001)
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert argv[:3] == ["vllm", "serve", str(model)] and env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert flags["--port"] == "8001" and flags["--tensor-parallel-size"] == "2"
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert flags["--generation-config"] == "vllm"
    assert flags["--max-model-len"] == "2048"  # 4096 + 2048 capped by the model's positions
    assert flags["--weight-transfer-config"] == '{"backend": "agentrl_gloo"}'  # no GPU here
    assert "agentrl.engines.vllm_transfer" in flags["--worker-extension-cls"]
    assert "--enforce-eager" in argv and argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
    assert "--enable-sleep-mode" not in argv

"""LoRA across machines on one CPU: an `agentrl serve` process started with the same
``[model.lora]`` holds the frozen base and receives only adapter tensors from a real
`agentrl train` (gloo over TCP), serving each step's adapter."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.spawn import spawn_servers
from tests.engines.test_serve_train import SERVE_CONFIG, TRAIN_CONFIG

LORA = "[model.lora]\nrank = 4\nalpha = 8.0\n"


@pytest.mark.slow  # a server process and a training run: ~75 s on the loaded 2-core box
def test_a_server_takes_adapter_only_syncs_from_a_lora_run(ckpt_a, tmp_path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(SERVE_CONFIG.format(model=ckpt_a).replace("[rollout]", LORA + "[rollout]"))
    (server,) = spawn_servers(config, 1, threads=1)
    try:
        train = tmp_path / "train.toml"
        train.write_text(TRAIN_CONFIG.format(model=ckpt_a, urls=json.dumps([server.url]))
                         .replace("[batch]", LORA + "[batch]"))
        out = tmp_path / "run"
        assert main(["train", str(train), "--out", str(out)]) == 0
        records = [json.loads(line) for line in
                   (out / "metrics.jsonl").read_text().splitlines()]
        # the trainer's log-probs of every collection are the server's: it serves exactly
        # the adapter of the step before (step 2's collection ran under step 1's update)
        assert [r["step"] for r in records] == [1, 2]
        assert all(r["loss/mismatch"] < 1e-4 for r in records)
        assert any(r["optim/grad_norm"] > 0 for r in records)
        info = RemoteEngine(server.url).connect()._get("/agentrl/info")
        # start-up (0), then one sync per step; a LoRA engine refuses any tensor that is
        # not an adapter's, so these syncs carried adapters only
        assert info["weight_version"] == 2 and info["num_requests"] >= 1
    finally:
        server.stop()

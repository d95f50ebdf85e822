"""The whole cross-machine path on one CPU: two `agentrl serve` processes (built-in
engine) and a short real `agentrl train` that generates on them and pushes its weights
to them after every step (no shared filesystem: gloo over TCP)."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.spawn import spawn_servers
from tests.engines.servers import engine_on
from tests.engines.test_remote import greedy_ids

SERVE_CONFIG = """
[model]
path = "{model}"
[rollout]
max_concurrent_rollouts = 8
[[environments]]
id = "tests.train.test_train_e2e:ShortAnswerEnv"
"""

TRAIN_CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 4
global_batch_size = 8
[rollout]
max_new_tokens = 8
max_turns = 1
remote_engines = {urls}
request_timeout_s = 60
weight_sync_timeout_s = 60
[optim]
lr = 3e-2
[train]
num_steps = 2
seed = 2
[log]
live = false
[[environments]]
id = "tests.train.test_train_e2e:ShortAnswerEnv"
"""


@pytest.fixture
def two_servers(ckpt_b, tmp_path):
    """Two servers on checkpoint B (the trainer starts from A: only syncs align them)."""
    config = tmp_path / "serve.toml"
    config.write_text(SERVE_CONFIG.format(model=ckpt_b))
    servers = spawn_servers(config, 2, threads=1)
    try:
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.stop()


def test_training_generates_on_two_servers_and_keeps_their_weights_in_step(
        ckpt_a, ckpt_b, two_servers, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(TRAIN_CONFIG.format(model=ckpt_a, urls=json.dumps(two_servers)))
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out)]) == 0

    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    final = engine_on(out / "checkpoints" / "step_2")
    want = greedy_ids(final)
    assert want != greedy_ids(engine_on(ckpt_b))  # else the check below could not fail
    for url in two_servers:
        remote = RemoteEngine(url).connect()
        # placement is about replicas started here: a server is never put to sleep
        assert remote._get("/is_sleeping")["is_sleeping"] is False
        info = remote._get("/agentrl/info")
        assert info["num_requests"] >= 1, f"{url} served nothing"
        assert info["weight_version"] == 2  # start (0), then one sync per step
        assert greedy_ids(remote) == want  # it serves the trained weights


def test_asynchronous_training_generates_ahead_on_a_server(ckpt_a, ckpt_b, tmp_path):
    """max_staleness = 1 with the engine in another process: collections are generated
    while the trainer trains, every trained token is at most one version old, and the
    server receives the trainer's weights (versions 1 and up; the last one is not sent,
    nothing is left to generate)."""
    config = tmp_path / "serve.toml"
    config.write_text(SERVE_CONFIG.format(model=ckpt_b))
    (server,) = spawn_servers(config, 1, threads=1)
    try:
        train = tmp_path / "train.toml"
        train.write_text(TRAIN_CONFIG.format(model=ckpt_a, urls=json.dumps([server.url]))
                         .replace("num_steps = 2", "num_steps = 4")
                         .replace("max_turns = 1", "max_turns = 1\nmax_staleness = 1"))
        out = tmp_path / "run"
        assert main(["train", str(train), "--out", str(out)]) == 0
        records = [json.loads(line) for line in
                   (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        assert all(r["staleness/max"] <= 1 for r in records)
        assert any(r["staleness/max"] == 1 for r in records)  # it did generate ahead
        info = RemoteEngine(server.url).connect()._get("/agentrl/info")
        assert info["weight_version"] >= 2
    finally:
        server.stop()

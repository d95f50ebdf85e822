"""Several ranks through torchrun: exact resume with sharded optimizer state, two
"machines" on localhost, and rank 0's long work never held inside a collective."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.envs import AgentEnv, Grade, Task
from agentrl.types import Message
from tests.parallel.ranks import free_port
from tests.train.test_train_e2e import _metrics, _train, _weights, _without_times

pytestmark = pytest.mark.slow  # each run starts 2 processes through torchrun

SLEEP_S = 6.0
COLLECTIVE_TIMEOUT_S = 3


class SlowEnv(AgentEnv):
    """One turn whose step takes SLEEP_S seconds: a collection slower than a tiny
    collective timeout."""

    max_turns = 1

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A prompt with a random number."""
        return Task([Message("user", f"Say {int(rng.integers(100))}.")], answer=0, key="k")

    def grade(self, answer: str) -> Grade:
        """Slow, then short replies win."""
        time.sleep(SLEEP_S)
        return Grade(float(len(answer) < 12), {"correct": float(len(answer) < 12)})


def test_two_ranks_resume_2_plus_2_equals_4_with_sharded_optimizer_state(tmp_path,
                                                                         model_dir) -> None:
    two = ["train.num_ranks=2"]
    full = _train(tmp_path, model_dir, "full", steps=4, overrides=two)
    split = _train(tmp_path, model_dir, "split", steps=2, overrides=two)
    optimizer_files = sorted(p.name for p in (split / "checkpoints" / "step_2" /
                                              "optimizer").iterdir())
    assert len([f for f in optimizer_files if f.endswith(".distcp")]) == 2  # one per rank
    (tmp_path / "split.toml").write_text(
        (tmp_path / "split.toml").read_text().replace("num_steps = 2", "num_steps = 4"))
    _train(tmp_path, model_dir, "split", steps=4, resume=True, overrides=two)
    a, b = _weights(full / "checkpoints" / "step_4"), _weights(split / "checkpoints" / "step_4")
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name
    assert [_without_times(r) for r in _metrics(full)] == [
        _without_times(r) for r in _metrics(split)]


def _torchrun(node_rank: int, port: int, config: Path, out: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--node-rank", str(node_rank), "--master-addr",
               "127.0.0.1", "--master-port", str(port), "-m", "agentrl", "train",
               str(config), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_two_machines_on_localhost_train_like_one_process(tmp_path, model_dir) -> None:
    one = _train(tmp_path, model_dir, "one", steps=2)
    config = tmp_path / "one.toml"
    out = tmp_path / "two_nodes"
    port = free_port()
    nodes = [_torchrun(rank, port, config, out) for rank in (0, 1)]
    logs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(logs)
    assert "ranks: 2" in logs[0]
    a, b = _weights(one / "checkpoints" / "step_2"), _weights(out / "checkpoints" / "step_2")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert [r["num_rollouts"] for r in _metrics(out)] == [4, 4]


def test_ranks_wait_out_a_collection_longer_than_the_collective_timeout(tmp_path,
                                                                        model_dir) -> None:
    # the collection takes >= 6 s (one slow step per rollout; rollouts run at once) while
    # ranks 1..N may sit in a collective for 3 s at most: they must wait outside it
    env = "tests.parallel.test_launch:SlowEnv"
    overrides = ["train.num_ranks=2", f"train.collective_timeout_s={COLLECTIVE_TIMEOUT_S}",
                 "environments.1.id=" + f'"{env}"']
    out = _train(tmp_path, model_dir, "slow", steps=1, overrides=overrides)
    records = _metrics(out)
    assert len(records) == 1 and records[0]["time/generate"] > 2 * COLLECTIVE_TIMEOUT_S


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.model import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


@pytest.mark.parametrize(("codes", "stopped"), [
    ((3, 3), True),
    ((3, -15), True),  # torchrun ended rank 1 after rank 0 had left with the summary
    ((-15, 3), True),
    ((3, 1), False),  # rank 1 crashed
    ((-15, -15), False),  # ended from outside: nothing stopped on purpose
    ((-6, 3), False),
])
def test_a_stop_is_told_from_a_crash_by_every_ranks_exit_status(codes, stopped):
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
        ProcessFailure,
    )

    from agentrl.parallel.launch import stopped_on_purpose

    failures = {rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code,
                                     error_file="") for rank, code in enumerate(codes)}
    assert stopped_on_purpose(ChildFailedError("agentrl", failures), 3) is stopped

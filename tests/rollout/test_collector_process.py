"""rollout.collector = "process": the rollout side (replicas, environments, runner) runs in
a child process, the trainer holds no engine; collections, weights, validation and sampler
states cross the pipe; a dead child or a failed start surfaces as an error naming it."""

from __future__ import annotations

import itertools
import os
import signal
import tomllib
from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.config import ConfigError, config_from_dict
from agentrl.model import build_tiny_checkpoint
from agentrl.rollout import collector_process
from agentrl.rollout.collector_process import ProcessCollector, pack_weights, unpack_weights
from agentrl.train.run import build_run
from agentrl.train.trainer import train
from tests.train.test_train_e2e import CONFIG


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def _config(model_dir, steps: int = 3, **rollout):
    raw = tomllib.loads(CONFIG.format(model=model_dir, budget=4096, steps=steps, eval_every=0))
    raw["rollout"].update({"max_staleness": 1, "collector": "process", **rollout})
    raw["train"].update(checkpoint_every=0)
    return config_from_dict(raw)


def test_the_rollout_side_runs_in_its_own_process(tmp_path, model_dir) -> None:
    run = build_run(_config(model_dir), tmp_path / "run")
    collector = run.collector
    assert isinstance(collector, ProcessCollector)
    assert run.engine is None and run.runner is None  # nothing generates in the trainer
    child = collector._process
    assert child.is_alive() and child.pid != os.getpid()
    before = collector.sampler_state_before(1)
    # the child starts from the trainer's sampler; with carry-over (on by default) the
    # state also names the first draw a resume redraws and the groups it skips
    assert before.pop("carry_over") == {"draw": 1, "trained": []}
    assert before == run.sampler.state_dict()
    assert set(run.evaluate_policy(2)) == {"Calculator-v0", "ShortAnswerEnv"}
    state = train(run)  # closes the collector at the end
    assert state.step == 3 and state.cumulative_rollouts == 12
    assert not child.is_alive() and child.exitcode == 0
    # the checkpoint's sampler state came from the child: it drew 3 collections' tasks
    assert state.sampler != before


def test_a_killed_collector_process_is_an_error_naming_it(tmp_path, model_dir) -> None:
    run = build_run(_config(model_dir), tmp_path / "run")
    try:
        collection = run.collect(1)
        assert collection.rollouts  # the child answers
        # what each rollout used crossed the pipe: the child's engine share and tokens
        costs = collection.costs
        assert sum(c.num_rollouts for c in costs.values()) == len(collection.rollouts)
        assert all(c.generation_s > 0 and c.num_generated_tokens > 0 for c in costs.values())
        os.kill(run.collector._process.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"collector process exited \(code -9\)"):
            run.collect(2)
    finally:
        run.close()


def test_weights_the_child_cannot_take_fail_the_next_call(tmp_path, model_dir) -> None:
    run = build_run(_config(model_dir), tmp_path / "run")
    try:
        unknown = run.collector.snapshot(iter([("no.such.weight", torch.zeros(2))]))
        run.collector.publish(unknown, 1)  # no reply to wait on
        with pytest.raises(RuntimeError, match="taking published weights failed"):
            run.collector.sampler_state_before(1)
        assert run.collector.sampler_state_before(1)  # reported once; the child goes on
    finally:
        run.close()


def test_a_failed_start_raises_the_childs_error(model_dir) -> None:
    config = _config(model_dir)
    with pytest.raises(RuntimeError, match="failed on 'start'(.|\n)*KeyError"):
        ProcessCollector(config, model_dir, {"not": "a sampler state"}, 1)


def test_process_collector_needs_asynchronous_collection(model_dir) -> None:
    with pytest.raises(ConfigError, match="max_staleness >= 1"):
        _config(model_dir, max_staleness=0)


@settings(max_examples=30, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=8),
       dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16]), min_size=8,
                       max_size=8),
       limit=st.sampled_from([8, 64, 2**20]))
def test_packed_weights_unpack_to_the_same_tensors(shapes, dtypes, limit) -> None:
    named = [(f"w{i}", torch.randn(shape).to(dtype))
             for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=False))]
    with patch.object(collector_process, "PACK_BYTES", limit):
        packed = pack_weights(iter(named))
    unpacked = unpack_weights(packed)
    assert list(unpacked) == [name for name, _ in named]
    for name, tensor in named:
        assert unpacked[name].dtype == tensor.dtype and torch.equal(unpacked[name], tensor)
    # a buffer per run of weights of one dtype, more only where a run passes the limit
    runs = 1 + sum(a.dtype != b.dtype for (_, a), (_, b) in itertools.pairwise(named))
    assert runs <= len(packed.buffers) <= len(named)
    if limit == 2**20:
        assert len(packed.buffers) == runs

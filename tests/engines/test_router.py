"""The router: spreading by outstanding tokens, stickiness per rollout, replicas leaving
service, one-pass bucketed weight sync to every replica, sleep for colocation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from agentrl.engines.http import ReplicaUnavailableError
from agentrl.engines.interface import Generation, SamplingParams, WeightSyncError
from agentrl.engines.router import EngineRouter, NoReplicaError
from agentrl.engines.weight_sync import buckets


class FakeReplica:
    """Answers after ``release`` is set; records requests, buckets and sleep calls."""

    def __init__(self, name: str, sync_timeout_s: float = 5.0) -> None:
        self.name = name
        self.sync_timeout_s = sync_timeout_s
        self.weight_version = 0
        self.keys: list[str | None] = []
        self.buckets: list[list[str]] = []
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.down = False
        self.fail_load = False
        self.hang_load_s = 0.0

    async def generate(self, prompt_ids, params, key=None):
        if self.down:
            raise ReplicaUnavailableError(f"{self.name} unreachable: connection refused")
        self.keys.append(key)
        await self.release.wait()
        return Generation([1], [-0.5], "length")

    def start_weight_update(self):
        self.calls.append("start")

    def load_bucket(self, bucket):
        if self.fail_load:
            raise RuntimeError("worker crashed")
        time.sleep(self.hang_load_s)
        self.buckets.append([name for name, _ in bucket])

    def finish_weight_update(self, version):
        self.calls.append(f"finish {version}")
        self.weight_version = version

    def sleep(self, level=1):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake {tags}")


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens)


async def start(router, prompt_len, max_tokens, key):
    task = asyncio.create_task(router.generate([0] * prompt_len, params(max_tokens), key))
    await asyncio.sleep(0)
    return task


def test_new_rollouts_go_to_the_least_loaded_replica_and_stay_there():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = EngineRouter([a, b])

    async def main():
        t1 = await start(router, 10, 90, "r1")      # a or b (both idle): costs 100 tokens
        first = 0 if a.keys else 1
        t2 = await start(router, 5, 15, "r2")       # the other one: 20 tokens
        t3 = await start(router, 5, 5, "r3")        # the one holding 20 < 100
        assert router.outstanding_tokens[first] == 100
        assert router.outstanding_tokens[1 - first] == 20 + 10
        t4 = await start(router, 50, 50, "r1")      # r1's second turn: back home despite load
        assert router.outstanding_tokens[first] == 200
        for replica in (a, b):
            replica.release.set()
        await asyncio.gather(t1, t2, t3, t4)
        return first

    first = asyncio.run(main())
    home, other = (a, b) if first == 0 else (b, a)
    assert home.keys == ["r1", "r1"] and other.keys == ["r2", "r3"]
    assert router.outstanding_tokens == [0, 0]
    assert router.num_requests == [2, 2]


def test_an_unreachable_replica_leaves_service_and_its_rollouts_move():
    a, b = FakeReplica("a"), FakeReplica("b")
    a.release.set()
    b.release.set()
    router = EngineRouter([a, b])

    async def main():
        await router.generate([0], params(4), "r1")
        home = router.pick("r1")
        [a, b][home].down = True
        with pytest.warns(UserWarning, match="replica .* taken out of service.*refused"):
            with pytest.raises(ReplicaUnavailableError, match="connection refused"):
                await router.generate([0], params(4), "r1")
        await router.generate([0], params(4), "r1")  # the next turn runs elsewhere
        return home

    home = asyncio.run(main())
    assert router.pick("r1") == 1 - home and list(router.down) == [home]
    router.replicas[1 - home].down = True
    with pytest.warns(UserWarning), pytest.raises(ReplicaUnavailableError):
        asyncio.run(router.generate([0], params(4), "r2"))
    with pytest.raises(NoReplicaError, match="every inference replica is out of service"):
        asyncio.run(router.generate([0], params(4), "r3"))


def test_weight_sync_reads_the_pairs_once_and_gives_every_replica_every_bucket():
    replicas = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
    router = EngineRouter(replicas, bucket_bytes=100)
    produced = []

    def pairs():  # 40, 40, 40 bytes in fp32 (10 floats), then 200 bytes alone, then 8
        for name, n in (("w0", 10), ("w1", 10), ("w2", 10), ("big", 50), ("b", 2)):
            produced.append(name)
            yield name, torch.zeros(n)

    router.update_weights(pairs())
    assert produced == ["w0", "w1", "w2", "big", "b"]  # one pass
    for replica in replicas:
        assert replica.buckets == [["w0", "w1"], ["w2"], ["big"], ["b"]]
        assert replica.calls == ["start", "finish 1"]
    assert router.weight_version == 1
    router.update_weights({"w": torch.zeros(1)}, version=7)  # a state dict works too
    assert router.weight_version == 7 and replicas[0].buckets[-1] == ["w"]
    router.adopt_version(3)  # e.g. replicas that loaded step 3's checkpoint on a resume
    router.update_weights({"w": torch.zeros(1)})
    assert [r.weight_version for r in replicas] == [4, 4, 4]


def test_buckets_cast_to_the_engine_dtype():
    out = list(buckets([("x", torch.ones(4)), ("i", torch.ones(2, dtype=torch.long))], 1000,
                       torch.bfloat16))
    assert [(n, t.dtype) for n, t in out[0]] == [("x", torch.bfloat16), ("i", torch.long)]


def test_a_failing_replica_fails_the_sync_naming_it():
    good, bad = FakeReplica("http://10.0.0.1:8000"), FakeReplica("http://10.0.0.2:8000")
    bad.fail_load = True
    router = EngineRouter([good, bad])
    with pytest.raises(WeightSyncError, match=r"http://10\.0\.0\.2:8000 failed in load: "
                                              "RuntimeError: worker crashed"):
        router.update_weights({"w": torch.zeros(1)})
    assert router.weight_version == 0


def test_a_stuck_replica_times_out_instead_of_hanging():
    stuck = FakeReplica("local replica 1", sync_timeout_s=0.2)
    stuck.hang_load_s = 30.0
    router = EngineRouter([FakeReplica("local replica 0"), stuck])
    begin = time.monotonic()
    with pytest.raises(WeightSyncError, match="local replica 1 timed out in load"):
        router.update_weights({"w": torch.zeros(1)})
    assert time.monotonic() - begin < 5.0
    assert any(t.name.startswith("weight-sync") for t in threading.enumerate())


def test_colocated_replicas_sleep_after_collection_and_wake_for_sync_and_generation():
    a, b = FakeReplica("a"), FakeReplica("b")
    a.release.set()
    b.release.set()
    router = EngineRouter([a, b], colocated=True, sleep_level=2)
    router.release_memory()
    router.update_weights({"w": torch.zeros(1)})
    asyncio.run(router.generate([0], params(2), "r"))
    assert a.calls == b.calls == ["sleep 2", "wake ['weights']", "start", "finish 1",
                                  "wake None"]
    separate = EngineRouter([FakeReplica("c")])
    separate.release_memory()
    assert separate.replicas[0].calls == []


def test_the_trainers_cached_gpu_memory_is_released_before_every_wake_up(monkeypatch):
    """vLLM allocates outside torch's cache: the blocks the trainer's allocator still
    caches must go back to the driver before a colocated replica wakes (a stand-in for
    the CUDA calls records the order; the real ones are checked by bench/gpu_acceptance)."""
    a = FakeReplica("a")
    a.release.set()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: a.calls.append("empty_cache"))
    router = EngineRouter([a], colocated=True)
    router.release_memory()
    router.update_weights({"w": torch.zeros(1)})
    asyncio.run(router.generate([0], params(2), "r"))
    assert a.calls == ["sleep 1", "empty_cache", "wake ['weights']", "start", "finish 1",
                       "empty_cache", "wake None"]


def test_per_replica_figures_show_how_a_step_spread():
    """Hand-worked: r1 (two turns) on one replica, r2 on the other, which then fails and
    leaves service; the clock is the test's, so the seconds are exact."""
    a, b = FakeReplica("a"), FakeReplica("b")
    router = EngineRouter([a, b])
    now = [100.0]
    router.figures.clock = lambda: now[0]

    async def main():
        t1 = await start(router, 10, 90, "r1")  # 100 tokens outstanding on its home
        home = router.pick("r1")
        t2 = await start(router, 5, 15, "r2")   # 20 on the other
        now[0] += 2.0
        [a, b][home].release.set()
        await t1
        await router.generate([0] * 50, params(50), "r1")  # a second turn, at once
        now[0] += 2.0
        [a, b][1 - home].release.set()
        await t2
        [a, b][1 - home].down = True
        with pytest.warns(UserWarning), pytest.raises(ReplicaUnavailableError):
            await router.generate([0], params(4), "r2")
        now[0] += 3.0
        return home

    home = asyncio.run(main())
    figures = router.replica_figures()
    mine, other = f"replica/{home}/", f"replica/{1 - home}/"
    assert {k.removeprefix(mine): v for k, v in figures.items() if k.startswith(mine)} == {
        "requests": 2, "rollouts": 1, "generated_tokens": 2, "busy_s": 2.0,
        "outstanding_peak": 100, "failures": 0, "down_s": 0.0, "tokens_per_s": 1.0,
        "served_version": 0}
    assert {k.removeprefix(other): v for k, v in figures.items() if k.startswith(other)} == {
        "requests": 1, "rollouts": 1, "generated_tokens": 1, "busy_s": 4.0,
        "outstanding_peak": 20, "failures": 1, "down_s": 3.0, "tokens_per_s": 0.25,
        "served_version": 0}
    now[0] += 1.0
    again = router.replica_figures()  # the next step starts from zero; still out of service
    assert again[mine + "requests"] == 0 and again[other + "down_s"] == 1.0

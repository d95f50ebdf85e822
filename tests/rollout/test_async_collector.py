"""The asynchronous collector: how far generation runs ahead, weights handed over,
sampler states for checkpoints, errors, shutdown; and the engine's in-flight updates."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from agentrl.engines.interface import SamplingParams, WeightSyncError
from agentrl.engines.torch_engine import TorchEngine
from agentrl.rollout.async_collector import AsyncCollector
from agentrl.rollout.runner import CollectionResult
from agentrl.staleness import StalenessError
from agentrl.types import Group, Rollout, Segment


class FakeEngine:
    """Holds a weight version; records every update and whether it was in flight."""

    def __init__(self) -> None:
        self.weight_version = 0
        self.updates: list[tuple[int, bool, float]] = []

    validating = False
    """Set while a validation generates: weights may then arrive only in flight."""

    def update_weights(self, named_tensors, version, *, in_flight=False) -> None:
        if self.validating and not in_flight:
            raise RuntimeError("update_weights called while generations are in flight")
        tensors = dict(named_tensors)
        self.updates.append((version, in_flight, float(tensors["w"])))
        self.weight_version = version


class FakeSampler:
    def __init__(self) -> None:
        self.draws = 0

    def state_dict(self) -> dict:
        return {"draws": self.draws}


class FakeRunner:
    """One group per collection, stamped with the engine's version when it started."""

    def __init__(self, engine: FakeEngine, sampler: FakeSampler, seconds: float = 0.01,
                 fail_at: int | None = None, version_offset: int = 0) -> None:
        self.engine, self.sampler, self.seconds = engine, sampler, seconds
        self.fail_at, self.version_offset = fail_at, version_offset
        self.starts: list[tuple[int, int]] = []

    async def collect(self, step: int, num_rollouts: int) -> CollectionResult:
        self.sampler.draws += 1
        version = self.engine.weight_version
        self.starts.append((step, version))
        await asyncio.sleep(self.seconds)
        if step == self.fail_at:
            raise RuntimeError("environment exploded")
        segment = Segment([1, 2], [0, 1], [0.0, -1.0], 1,
                          version_runs=[(1, version + self.version_offset)])
        rollouts = [Rollout(f"s{step}-g0-r{j}", f"s{step}-g0", "x", [segment], float(j))
                    for j in range(num_rollouts)]
        return CollectionResult(groups=[Group(f"s{step}-g0", "x", rollouts)])


def _train(collector: AsyncCollector, steps: range, seconds: float = 0.15) -> list:
    got = []
    for step in steps:
        got.append(collector.next_collection(step))
        time.sleep(seconds)  # the trainer trains; generation goes on meanwhile
        collector.publish({"w": torch.tensor(float(step))}, version=step)
    return got


@pytest.mark.parametrize("k", [1, 2])
def test_generation_runs_ahead_by_at_most_k_versions(k: int) -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    runner = FakeRunner(engine, sampler)
    collector = AsyncCollector(runner, sampler, 2, max_staleness=k, first_step=1, last_step=6)
    try:
        got = _train(collector, range(1, 7))
    finally:
        collector.close()
    assert [c.groups[0].group_id for c in got] == [f"s{s}-g0" for s in range(1, 7)]
    for step, version in runner.starts:
        assert step - 1 - k <= version <= step - 1  # never more than k versions behind
    # generation really ran ahead: collections 1..k+1 all started on the initial weights
    assert [v for s, v in runner.starts[:k + 1]] == [0] * (k + 1)
    # weights reach the engine only between collections, newest first
    assert all(not in_flight for _, in_flight, _ in engine.updates)
    assert [v for v, _, _ in engine.updates] == sorted({v for v, _, _ in engine.updates})


def test_in_flight_updates_reach_the_engine_as_soon_as_published() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    runner = FakeRunner(engine, sampler, seconds=0.2)  # slow generation
    collector = AsyncCollector(runner, sampler, 1, max_staleness=1, first_step=1, last_step=3,
                               inflight_updates=True)
    try:
        collector.next_collection(1)
        collector.publish({"w": torch.tensor(7.0)}, version=1)
        deadline = time.time() + 5
        while not engine.updates and time.time() < deadline:
            time.sleep(0.01)
    finally:
        collector.close()
    # collection 2 is still being generated (0.2 s) when version 1 arrives: applied at once
    assert engine.updates[0] == (1, True, 7.0)


def test_sampler_state_is_the_one_before_the_collection_drew() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    runner = FakeRunner(engine, sampler, seconds=0.0)
    collector = AsyncCollector(runner, sampler, 1, max_staleness=2, first_step=1, last_step=4)
    try:
        collector.next_collection(1)
        deadline = time.time() + 5
        while sampler.draws < 3 and time.time() < deadline:  # collections 2, 3 drawn ahead
            time.sleep(0.01)
        assert sampler.draws == 3
        # a checkpoint after step 1 must let a resume redraw collection 2 from scratch
        assert collector.sampler_state_before(2) == {"draws": 1}
        assert collector.sampler_state_before(3) == {"draws": 2}
        assert collector.sampler_state_before(4) == {"draws": 3}  # not started: current
    finally:
        collector.close()


def test_collector_errors_reach_the_trainer() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    collector = AsyncCollector(FakeRunner(engine, sampler, fail_at=2), sampler, 1,
                               max_staleness=1, first_step=1, last_step=3)
    try:
        collector.next_collection(1)
        with pytest.raises(RuntimeError, match="collector failed") as info:
            collector.next_collection(2)
        assert "environment exploded" in str(info.value.__cause__)
    finally:
        collector.close()


class RefusingEngine(FakeEngine):
    """A LoRA-like engine (takes each version at once) whose every sync fails."""

    keeps_adapter_versions = True

    def update_weights(self, named_tensors, version, *, in_flight=False) -> None:
        raise WeightSyncError(f"adapter v{version} refused: out of adapter slots")


@pytest.mark.parametrize("engine", [RefusingEngine(), None])
def test_a_failed_in_flight_sync_stops_the_run_with_its_message(engine) -> None:
    if engine is None:  # full weights, taken in flight
        engine = FakeEngine()
        engine.update_weights = RefusingEngine.update_weights.__get__(engine)
    sampler = FakeSampler()
    runner = FakeRunner(engine, sampler, seconds=0.2)  # collection 2 runs when v1 arrives
    collector = AsyncCollector(runner, sampler, 1, max_staleness=1, first_step=1, last_step=4,
                               inflight_updates=True)
    outcome: list[BaseException] = []

    def trainer() -> None:
        try:
            _train(collector, range(1, 5), seconds=0.0)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=trainer, daemon=True)
    try:
        worker.start()
        worker.join(timeout=20)  # before the fix: collection 3 waits for v1 forever
        assert not worker.is_alive(), "the trainer hangs waiting for weights"
    finally:
        collector.close()
    [error] = outcome
    assert isinstance(error, RuntimeError) and "adapter v1 refused" in str(error)
    assert isinstance(error.__cause__, WeightSyncError)


def test_close_while_waiting_for_weights_ends_the_thread() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    collector = AsyncCollector(FakeRunner(engine, sampler), sampler, 1, max_staleness=1,
                               first_step=1, last_step=10)
    collector.next_collection(1)  # collection 3 now waits for version 1, never published
    collector.close()
    assert not any(t.name == "agentrl-collector" for t in threading.enumerate())
    collector.publish({"w": torch.tensor(1.0)}, version=1)  # after close: a no-op


def test_a_token_past_the_bound_is_named_never_dropped() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    # the runner stamps every token 3 versions older than the engine holds
    collector = AsyncCollector(FakeRunner(engine, sampler, version_offset=-3), sampler, 2,
                               max_staleness=1, first_step=1, last_step=1)
    try:
        with pytest.raises(StalenessError, match="older than rollout.max_staleness = 1"):
            collector.next_collection(1)
    finally:
        collector.close()


def test_refuses_a_synchronous_bound() -> None:
    engine, sampler = FakeEngine(), FakeSampler()
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        AsyncCollector(FakeRunner(engine, sampler), sampler, 1, max_staleness=0,
                       first_step=1, last_step=1)


# ------------------------------------------------------------------ TorchEngine versions


def test_torch_engine_stamps_versions_and_swaps_weights_between_decode_steps(
        tiny_model, tiny_ckpt) -> None:
    from agentrl.model import load_pretrained

    engine = TorchEngine(tiny_model, max_len=64)
    other = load_pretrained(tiny_ckpt, attention="torch").eval()
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    params = SamplingParams(temperature=0.0, max_tokens=12)

    async def generate_with_a_swap():
        task = asyncio.ensure_future(engine.generate([5, 6, 7], params))
        while engine.num_forwards < 4:  # prefill + 3 decode steps under version 0
            await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="in flight"):
            engine.update_weights(other.state_dict(), version=1)
        engine.update_weights(other.state_dict().items(), version=1, in_flight=True)
        return await task

    generation = asyncio.run(generate_with_a_swap())
    assert engine.weight_version == 1
    assert generation.versions == [0] * 4 + [1] * 8
    # after the swap the engine decodes with the new weights: greedy tokens change
    fresh = TorchEngine(load_pretrained(tiny_ckpt, attention="torch").eval(), max_len=64)
    unswapped = asyncio.run(fresh.generate([5, 6, 7], params))
    assert unswapped.versions == [0] * 12
    assert generation.token_ids[:4] == unswapped.token_ids[:4]
    assert generation.token_ids[4:] != unswapped.token_ids[4:]


def test_weights_published_before_the_first_collection_reach_the_engine() -> None:
    """The start-up sync to servers that did not load the checkpoint (and a resume's) is
    applied at once, not dropped because no collection runs yet."""
    engine = FakeEngine()
    collector = AsyncCollector(FakeRunner(engine, FakeSampler()), FakeSampler(), 2, 1, 5, 6)
    collector.publish({"w": torch.tensor(4.0)}, 4)
    assert engine.updates == [(4, False, 4.0)] and engine.weight_version == 4
    assert collector.next_collection(5).groups  # version 4 is new enough for step 5
    collector.close()


def test_weights_wait_for_a_validation_sharing_the_engine() -> None:
    """A validation runs on the collector's loop; a collection that ends meanwhile must not
    hand the engine new weights under the validation's generations (the engine refuses
    that), but after it, before the next collection starts."""
    engine, sampler = FakeEngine(), FakeSampler()
    runner = FakeRunner(engine, sampler, seconds=0.05)
    collector = AsyncCollector(runner, sampler, 1, max_staleness=1, first_step=1, last_step=4)

    async def validation() -> str:
        engine.validating = True
        try:
            await asyncio.sleep(0.4)  # collection 2 ends meanwhile; version 1 is pending
        finally:
            engine.validating = False
        return "accuracy"

    try:
        collector.next_collection(1)
        collector.publish({"w": torch.tensor(1.0)}, version=1)  # collection 3 needs it
        assert collector.run_on_loop(validation) == (True, "accuracy")
        assert collector.next_collection(2).groups and collector.next_collection(3).groups
    finally:
        collector.close()
    assert engine.updates == [(1, False, 1.0)]  # applied once, after the validation
    assert (3, 1) in runner.starts  # collection 3 generated with version 1


def test_the_snapshot_is_the_trainers_own_copy() -> None:
    from agentrl.rollout.collector_process import ProcessCollector, unpack_weights

    weight = torch.ones(3)
    for snapshot, named in ((AsyncCollector.snapshot, dict),
                            (ProcessCollector.snapshot, unpack_weights)):
        copy = named(snapshot(iter([("w", weight * 1)])))  # a gathered tensor, as the trainer's
        assert list(copy) == ["w"] and copy["w"].device.type == "cpu"
    # an unsharded float32 CPU policy yields its parameters themselves (no cast, no
    # gather): a snapshot must copy them, or the child would read the next updates
    thread_copy = AsyncCollector.snapshot(iter([("w", weight)]))
    process_copy = unpack_weights(ProcessCollector.snapshot(iter([("w", weight)])))
    weight.add_(1.0)  # the trainer's next update, in place
    assert torch.equal(thread_copy["w"], torch.ones(3))
    assert torch.equal(process_copy["w"], torch.ones(3))

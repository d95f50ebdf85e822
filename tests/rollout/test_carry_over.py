"""Carry-over (rollout.carry_over): a collection is handed over once it holds its quota of
complete groups, a slow group is trained in the next one, a group that would pass the
staleness bound is waited for, nothing is discarded or trained twice, resume included."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.rollout.async_collector import AsyncCollector
from agentrl.rollout.carry_over import CarryPool, check_resumable, draw_of
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Group, Rollout, Segment

ENVS = {"fast": 1.0, "slow": 1.0}
GROUPS = 4  # per collection
SIZE = 2  # rollouts per group


def _group(group_id: str, env: str, version: int) -> Group:
    segment = Segment([1, 2], [0, 1], [0.0, -1.0], 1, version_runs=[(1, version)])
    rollouts = [Rollout(f"{group_id}-r{j}", group_id, env, [segment], float(j))
                for j in range(SIZE)]
    return Group(group_id, env, rollouts)


def _draw(sampler: EnvironmentSampler, step: int) -> list[tuple[str, object]]:
    return [(f"s{step}-g{i}", d) for i, d in enumerate(sampler.sample_tasks(GROUPS))]


# ------------------------------------------------------------------ the schedule itself


def _simulate(data, k: int, steps: int, resume_at: int | None = None):
    """Run the collector's schedule (two draws in play, each drawn once the weights allow
    it, its groups started as places free up) with hypothesis picking, at every turn,
    which running group ends or whether the trainer publishes the version of the last
    collection it took. Returns the collections and the drawn group ids."""
    sampler = EnvironmentSampler(ENVS, seed=data.draw(st.integers(0, 100)))
    pool, states, collections = CarryPool(k), {}, {}
    next_draw, version, step, queue, running, drawn = 1, 0, 1, [], [], set()
    while step <= steps:
        while next_draw <= min(step + 1, steps) and version >= next_draw - 1 - k:
            states[next_draw] = sampler.state_dict()
            tasks = _draw(sampler, next_draw)
            drawn |= {gid for gid, _ in tasks}
            queue += pool.add_draw(next_draw, tasks, version)
            next_draw += 1
        while queue and len(running) < GROUPS:  # refill, oldest draw first
            pool.started(queue[0], version)
            running.append((queue.pop(0), version))
        taken = pool.take(step)
        if taken is not None:
            collections[step] = (taken, Counter(pool.quotas[step]))
            if step == resume_at:  # a checkpoint after training it, then a resume
                first, trained = pool.resume_point(step + 1, next_draw)
                sampler.load_state_dict(states.get(first, sampler.state_dict()))
                pool, next_draw, queue, running = CarryPool(k, set(trained)), first, [], []
                version = step
            step += 1
            continue
        can_publish = version < step - 1  # trained collections not yet published
        choice = data.draw(st.integers(0 if can_publish else 1, len(running)))
        assert running or can_publish, f"collection {step} can never be due"
        if choice == 0:
            version += 1
            continue
        pending, started = running.pop(choice - 1)
        pool.complete(_group(pending.group_id, pending.env, started))
    return collections, drawn


@pytest.mark.parametrize("k", [1, 2])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_drawn_group_is_trained_once_in_quota_within_the_bound(k: int, data) -> None:
    steps = data.draw(st.integers(1, 7))
    resume_at = data.draw(st.none() | st.integers(1, steps))
    collections, drawn = _simulate(data, k, steps, resume_at)
    trained = [g.group_id for groups, _ in collections.values() for g in groups]
    assert len(trained) == len(set(trained))  # nothing trained twice
    drawn_for_run = {gid for gid in drawn if draw_of(gid) <= steps}
    assert set(trained) == drawn_for_run  # nothing lost: every sampled task trained
    for step, (groups, quota) in collections.items():
        # the sampler's per-collection accounting holds: its quota per environment
        assert Counter(g.env for g in groups) == quota
        assert sum(len(g.rollouts) for g in groups) == GROUPS * SIZE
        for group in groups:  # no token past the bound when trained
            version = group.rollouts[0].segments[0].version_runs[0][1]
            assert step - 1 - version <= k


def test_a_group_at_its_deadline_is_waited_for_never_carried() -> None:
    pool = CarryPool(max_staleness=1)
    sampler = EnvironmentSampler({"x": 1.0}, seed=0)
    first = pool.add_draw(1, [(f"s1-g{i}", t) for i, t in enumerate(sampler.sample_tasks(2))],
                          version=0)  # deadline 2
    second = pool.add_draw(2, [(f"s2-g{i}", t) for i, t in enumerate(sampler.sample_tasks(2))],
                           version=1)  # deadline 3
    for pending in [first[1], *second]:
        pool.complete(_group(pending.group_id, "x", 0))
    # collection 1 (deadline 2 > 1): s1-g0 still runs and carries over
    assert [g.group_id for g in pool.take(1)] == ["s1-g1", "s2-g0"]
    # collection 2: s1-g0 has reached its deadline; s2-g1 is complete but must wait
    assert pool.take(2) is None
    pool.complete(_group("s1-g0", "x", 0))
    assert [g.group_id for g in pool.take(2)] == ["s1-g0", "s2-g1"]


def test_a_resume_point_names_the_carried_groups() -> None:
    pool = CarryPool(max_staleness=2)
    sampler = EnvironmentSampler({"x": 1.0}, seed=0)
    for draw in (1, 2):
        tasks = [(f"s{draw}-g{i}", t) for i, t in enumerate(sampler.sample_tasks(2))]
        for pending in pool.add_draw(draw, tasks, version=0):
            if pending.group_id != "s1-g0":
                pool.complete(_group(pending.group_id, "x", 0))
    assert [g.group_id for g in pool.take(1)] == ["s1-g1", "s2-g0"]
    # a checkpoint after step 1: draw 1 still has s1-g0; s1-g1 and s2-g0 were trained
    assert pool.resume_point(2, next_draw=3) == (1, ["s1-g1", "s2-g0"])
    resumed = CarryPool(2, {"s1-g1", "s2-g0"})
    again = [(f"s1-g{i}", t) for i, t in enumerate(EnvironmentSampler({"x": 1.0}, 0)
                                                    .sample_tasks(2))]
    assert [p.group_id for p in resumed.add_draw(1, again, version=1)] == ["s1-g0"]
    with pytest.raises(ValueError, match="rollout.carry_over = true"):
        check_resumable({"draw": 1, "trained": []}, first_step=2, carrying=False)


# ------------------------------------------------------------------ the collector


class Engine:
    def __init__(self) -> None:
        self.weight_version = 0

    def update_weights(self, named_tensors, version, *, in_flight=False) -> None:
        self.weight_version = version


class GatedRunner:
    """Groups end at once, except those named in ``gates`` (each waits for its event);
    every group is stamped with the engine's version when it started."""

    def __init__(self, sampler: EnvironmentSampler, gates: dict[str, threading.Event]):
        self.engine, self.sampler, self.gates = Engine(), sampler, gates
        self.finished: list[str] = []

    def draw(self, step: int, num_rollouts: int) -> list[tuple[str, object]]:
        return _draw(self.sampler, step)

    async def collect_group(self, group_id: str, env: str, task_seed: int) -> Group:
        version = self.engine.weight_version
        gate = self.gates.get(group_id)
        while gate is not None and not gate.is_set():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)
        self.finished.append(group_id)
        return _group(group_id, env, version)

    def take_played(self) -> dict:
        return {"num_played": {}}


def _wait_until(condition, seconds: float = 20.0) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("k", [1, 2])
def test_a_collection_is_handed_over_before_its_slow_group_which_trains_later(k) -> None:
    gate = threading.Event()
    runner = GatedRunner(EnvironmentSampler(ENVS, seed=0), {"s1-g0": gate})
    collector = AsyncCollector(runner, runner.sampler, GROUPS * SIZE, k, 1, 4,
                               carry_over=True)
    try:
        got = [collector.next_collection(1)]  # due while s1-g0 still runs
        assert "s1-g0" not in runner.finished
        gate.set()
        for step in (2, 3, 4):
            collector.publish({"w": torch.zeros(1)}, version=step - 1)
            got.append(collector.next_collection(step))
    finally:
        collector.close()
    ids = [[g.group_id for g in c.groups] for c in got]
    assert "s1-g0" not in ids[0] and len(got[0].rollouts) == GROUPS * SIZE
    [later] = [step for step, names in enumerate(ids, 1) if "s1-g0" in names]
    assert 2 <= later <= 1 + k  # started under version 0: trained by step 1 + k
    assert got[later - 1].carried_groups >= 1
    assert sorted(sum(ids, [])) == sorted(f"s{s}-g{i}" for s in range(1, 5)
                                          for i in range(GROUPS))


def test_a_group_that_would_pass_the_bound_is_waited_for() -> None:
    """k = 1: draw 2 starts under version 0, so step 3 (trained version 2) may not train
    it; collection 2 must wait for its slow group although draw 3 has enough done."""
    gate = threading.Event()
    runner = GatedRunner(EnvironmentSampler(ENVS, seed=0), {"s2-g0": gate})
    # in-flight updates: version 1 reaches the engine while s2-g0 runs
    collector = AsyncCollector(runner, runner.sampler, GROUPS * SIZE, 1, 1, 3,
                               inflight_updates=True, carry_over=True)
    try:
        collector.next_collection(1)
        collector.publish({"w": torch.zeros(1)}, version=1)  # draw 3 starts
        others = {f"s{s}-g{i}" for s in (2, 3) for i in range(GROUPS)} - {"s2-g0"}
        _wait_until(lambda: others <= set(runner.finished))
        time.sleep(0.05)  # give a wrong collector the chance to hand collection 2 over
        assert 2 not in collector._ready  # waiting for s2-g0, not carrying it
        gate.set()
        second = collector.next_collection(2)  # check_bound: nothing past k = 1
        assert "s2-g0" in [g.group_id for g in second.groups]
    finally:
        collector.close()


def test_checkpoint_state_of_a_carried_group_regenerates_it_once() -> None:
    gate = threading.Event()
    runner = GatedRunner(EnvironmentSampler(ENVS, seed=0), {"s1-g0": gate})
    collector = AsyncCollector(runner, runner.sampler, GROUPS * SIZE, 2, 1, 4,
                               carry_over=True)
    try:
        first = collector.next_collection(1)
        state = collector.sampler_state_before(2)  # the checkpoint after step 1
    finally:
        collector.close()  # the run is killed: s1-g0 is lost in flight
    assert state["carry_over"]["draw"] == 1
    assert sorted(state["carry_over"]["trained"]) == sorted(
        g.group_id for g in first.groups)
    sampler = EnvironmentSampler(ENVS, seed=99)
    sampler.load_state_dict(state)
    resumed_runner = GatedRunner(sampler, {})
    resumed = AsyncCollector(resumed_runner, sampler, GROUPS * SIZE, 2, 2, 4,
                             carry_over=True, resume=state["carry_over"])
    later = []
    try:
        for step in (2, 3, 4):
            resumed.publish({"w": torch.zeros(1)}, version=step - 1)
            later.append(resumed.next_collection(step))
    finally:
        resumed.close()
    trained = [g.group_id for c in [first, *later] for g in c.groups]
    assert len(trained) == len(set(trained))
    assert sorted(trained) == sorted(f"s{s}-g{i}" for s in range(1, 5) for i in range(GROUPS))
    assert "s1-g0" in [g.group_id for g in later[0].groups]

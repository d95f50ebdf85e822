"""Environment calls without a thread per call: the reused threads of ``"thread"``
isolation and the event-loop calls of ``"inline"``, with their deadlines and failures."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest

from agentrl.envs.registry import make
from agentrl.rollout.env_contract import EnvError
from agentrl.rollout.env_guard import GuardedEnv
from agentrl.rollout.env_thread_caller import InlineCaller, ThreadCaller
from agentrl.rollout.env_threads import ENV_THREADS, ThreadPool
from agentrl.rollout.episode import isolation_of


class Probe:
    """``reset`` records the thread it runs on; ``step`` hangs until released, sleeps
    0.3 s or raises, as ``mode`` says."""

    def __init__(self, mode: str = "hang") -> None:
        self.threads: list[int] = []
        self.release = threading.Event()
        self.mode = mode

    def reset(self) -> int:
        self.threads.append(threading.get_ident())
        return threading.get_ident()

    def step(self) -> str:
        if self.mode == "hang":
            self.release.wait(5)
        elif self.mode == "slow":
            time.sleep(0.3)
        else:
            raise RuntimeError("broken on purpose")
        return "late"


def test_sequential_calls_reuse_one_thread_off_the_event_loop() -> None:
    async def main() -> tuple[set[int], int]:
        caller = ThreadCaller("probe", Probe())
        before = ENV_THREADS.started
        for _ in range(20):
            await caller.call("reset", (), {}, 5.0)
        return set(caller.env.threads), ENV_THREADS.started - before

    threads, started = asyncio.run(main())
    assert len(threads) <= 2 and started <= 2  # not one new thread per call
    assert threading.get_ident() not in threads


def test_a_call_past_its_deadline_blocks_nobody_and_the_next_call_gets_a_thread() -> None:
    async def main() -> tuple[str, int]:
        probe = Probe()
        caller = ThreadCaller("probe", probe)
        with pytest.raises(EnvError) as hung:
            await caller.call("step", (), {}, 0.1)
        fresh = ThreadCaller("probe", Probe())  # a new rollout's instance
        start = time.monotonic()
        ident = await fresh.call("reset", (), {}, 5.0)
        took = time.monotonic() - start
        probe.release.set()
        assert took < 1.0
        return hung.value.kind, ident

    kind, ident = asyncio.run(main())
    assert kind == "step_timeout"
    assert ident != threading.get_ident()


def test_the_pool_keeps_at_most_max_idle_threads() -> None:
    pool = ThreadPool(max_idle=1)
    done = [threading.Event() for _ in range(3)]
    gate = threading.Event()

    def job(event: threading.Event):
        def run() -> None:
            gate.wait(5)
            event.set()
        return run

    for event in done:
        pool.run(job(event), "job")
    assert pool.started == 3  # all three ran at once: none waited for a free thread
    gate.set()
    assert all(e.wait(5) for e in done)
    deadline = time.monotonic() + 5
    while pool._idle_count() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the workers hand themselves back just after their job
    time.sleep(0.05)
    assert pool._idle_count() == 1


def _call_in_child(queue) -> None:
    async def main() -> int:
        return await ThreadCaller("probe", Probe()).call("reset", (), {}, 5.0)

    queue.put(asyncio.run(main()))


def test_a_forked_child_starts_threads_of_its_own() -> None:
    asyncio.run(ThreadCaller("probe", Probe()).call("reset", (), {}, 5.0))  # one idle left
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_call_in_child, args=(queue,))
    child.start()
    child.join(20)
    assert child.exitcode == 0
    assert isinstance(queue.get(timeout=1), int)


def test_inline_calls_run_on_the_event_loop_and_fail_like_thread_calls() -> None:
    async def main() -> None:
        caller = InlineCaller("probe", Probe("fail"))
        assert await caller.call("reset", (), {}, 5.0) == threading.get_ident()
        with pytest.raises(EnvError) as failed:
            await caller.call("step", (), {}, 5.0)
        assert failed.value.kind == "step_raised" and "broken on purpose" in str(failed.value)
        caller = InlineCaller("probe", Probe("slow"))
        with pytest.raises(EnvError) as late:
            await caller.call("step", (), {}, 0.1)
        assert late.value.kind == "step_timeout"
        assert "returned after 0.3 s" in str(late.value)
        assert late.value.loop_stall_s == pytest.approx(0.2, abs=0.1)
        assert caller.stall_s == pytest.approx(0.2, abs=0.1)

    asyncio.run(main())


def test_the_built_in_quick_environments_run_inline_and_play_a_step() -> None:
    assert isolation_of("agentrl/Countdown-v0") == "inline"
    assert isolation_of("agentrl/Calculator-v0") == "inline"

    async def main() -> float:
        env = await GuardedEnv.open(
            "calc", lambda: make("agentrl/Calculator-v0"), 5.0, 10_000, isolation="inline")
        assert isinstance(env.caller, InlineCaller)
        await env.reset(seed=0)
        result = await env.step("7")
        await env.close()
        return result.reward

    assert asyncio.run(main()) in (0.0, 1.0)


def test_a_call_is_over_before_its_caller_hears_the_result() -> None:
    # a rollout that closes its instance right after a step must find it idle: a close
    # deferred to a thread still finishing the step would swallow the close's error.
    # The thread's bookkeeping is slowed down here, so the order is what is tested
    class Quick:
        def step(self) -> str:
            return "ok"

    async def main() -> list[bool]:
        caller = ThreadCaller("quick", Quick())
        finish = caller._finished

        def slow_finish(what, outcome) -> None:
            time.sleep(0.02)
            finish(what, outcome)

        caller._finished = slow_finish
        in_flight = []
        for _ in range(5):
            await caller.call("step", (), {}, 5.0)
            in_flight.append(caller._in_flight)
        return in_flight

    assert not any(asyncio.run(main()))

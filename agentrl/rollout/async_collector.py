"""Asynchronous collection: generation runs ahead of training by at most k policy versions.

With ``rollout.max_staleness = k >= 1`` the rollout runner lives on its own thread with
its own asyncio loop (torch releases the GIL inside its ops, environments wait on I/O),
and the inference engine holds its own copy of the policy. Collections are produced in
step order; the collection of step ``s`` starts only once the engine holds weights of
version ``>= s - 1 - k`` (step ``s`` trains version ``s - 1``), so no trained token is
more than k versions old. Before each collection the engine takes the newest weights the
trainer published; with ``rollout.inflight_updates`` it takes them as soon as they arrive,
between two decode steps, and running rollouts continue under them. A LoRA engine
(``keeps_adapter_versions``) takes each adapter version as soon as it arrives: requests
already running finish on the adapter they started with, new ones take the newest.

The trainer asks :meth:`AsyncCollector.next_collection` for step ``s`` and gets it once
complete (oldest weights first: collections are trained in the order they were started);
after its updates it :meth:`publish`-es the new weights. Checkpoints store the sampler
state from before the first untrained collection (:meth:`sampler_state_before`), so a
resumed run regenerates exactly the collections whose training was lost, with the same
rollout ids and tasks, and discards nothing that was trained.

With ``carry_over`` (``rollout.carry_over``) the next collection's groups start without
waiting for the slowest group of the one before, and a collection is handed over once it
holds its quota of complete groups; groups still running carry over to the next one
unless that would break the bound (``agentrl.rollout.carry_over``). Checkpoints then
also name the carried groups, so that a resume regenerates each exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Iterable
from typing import Any

import msgspec
import torch

from agentrl.rollout.carry_over import CarryPool, check_resumable, draw_of
from agentrl.rollout.runner import CollectionResult
from agentrl.staleness import check_bound, engine_version

POLL_S = 1.0
"""Seconds between checks that the collector thread is still alive while waiting."""


class AsyncCollector:
    """Produces steps' collections on a background thread, at most k versions ahead."""

    def __init__(
        self, runner: Any, sampler: Any, num_rollouts: int, max_staleness: int,
        first_step: int, last_step: int, inflight_updates: bool = False,
        carry_over: bool = False, resume: dict[str, Any] | None = None,
    ) -> None:
        """Produce collections ``first_step .. last_step`` of ``num_rollouts`` each with
        ``runner`` (whose engine must not share the trainer's module), starting with the
        first :meth:`next_collection` call: nothing is generated before training starts
        (e.g. during the validation at step 0). ``carry_over``: groups still running
        when their collection is due carry over (module doc); ``resume``: the
        ``"carry_over"`` entry of the checkpoint's sampler state, if any."""
        if max_staleness < 1:
            raise ValueError(f"AsyncCollector needs max_staleness >= 1, got {max_staleness}; "
                             "use the synchronous loop for 0")
        self.runner = runner
        self.engine = runner.engine
        self.sampler = sampler
        self.num_rollouts = num_rollouts
        self.max_staleness = max_staleness
        self.inflight_updates = inflight_updates
        self.first_step, self.last_step = first_step, last_step
        self._lock = threading.Condition()
        self._ready: dict[int, CollectionResult] = {}
        self._engine_idle_s: dict[int, float] = {}
        self._sampler_states: dict[int, dict[str, Any]] = {}
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._weights_arrived: asyncio.Event | None = None
        self._validations = 0
        """Coroutines from :meth:`run_on_loop` running on the loop: new weights wait for
        them between collections (an engine takes them only with nothing in flight)."""
        self._task: asyncio.Task | None = None
        self.carry_over = carry_over
        check_resumable(resume, first_step, carry_over)
        resume = resume or {"draw": first_step, "trained": []}
        self._pool = CarryPool(max_staleness, set(resume["trained"]))
        self._next_draw = int(resume["draw"])
        self._running: set[asyncio.Task] = set()
        self._queue: collections.deque[Any] = collections.deque()
        """Drawn groups not started yet, oldest draw first (``CarryPool``: refill)."""
        self._max_running = 0
        """Groups running at once: one draw's worth."""
        self._idle_since: float | None = None
        self._idle_s = 0.0
        self._thread = threading.Thread(target=self._main, name="agentrl-collector",
                                        daemon=True)

    # ------------------------------------------------------------------ trainer side

    def next_collection(self, step: int) -> CollectionResult:
        """The collection of ``step``, once complete (its slowest rollout included: none is
        left behind, ``agentrl.staleness``); raises what the collector raised."""
        if self._thread.ident is None:
            self._thread.start()
        with self._lock:
            while step not in self._ready:
                if self._error is not None:
                    raise RuntimeError(f"the rollout collector failed: {self._error}") \
                        from self._error
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout collector stopped before step {step}")
                self._lock.wait(POLL_S)
            result = self._ready.pop(step)
            idle = self._engine_idle_s.pop(step, 0.0)
            if self.carry_over:
                self._forget_before(step)
        check_bound(result.groups, step - 1, self.max_staleness)  # nothing is dropped
        return msgspec.structs.replace(result, engine_idle_s=idle)

    @staticmethod
    def snapshot(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The trainer's own copy of the weights for :meth:`publish`, where they are (on
        rank 0's GPU: the memory plan's "weight snapshots"): the engine on this process's
        thread reads them while the trainer changes its own in place."""
        return {name: tensor.clone() for name, tensor in named_tensors}

    def publish(self, snapshot: dict[str, torch.Tensor], version: int) -> None:
        """Hand the weights of ``version`` to the engine; returns at once. ``snapshot``
        must be the caller's own copy (the trainer keeps changing its weights in place).
        Once every collection is produced there is nothing left to generate, and nothing
        is sent; before the first collection started, the engine takes them at once."""
        if self._thread.ident is None:  # nothing generates yet (e.g. the start-up sync)
            self.engine.update_weights(snapshot.items(), version)
            return
        if self._done():
            return
        try:
            self._loop.call_soon_threadsafe(self._on_weights, version, snapshot)
        except RuntimeError:  # the loop closed meanwhile: the collector has finished
            if not self._done():
                raise

    def sampler_state_before(self, step: int) -> dict[str, Any]:
        """The sampler state from just before collection ``step`` drew its first task
        (the current state when it has not started): what a checkpoint taken before
        training ``step`` must hold so that a resume regenerates ``step`` identically."""
        with self._lock:
            if self.carry_over:
                return self._resume_state(step)
            if step in self._sampler_states:
                return self._sampler_states[step]
            return self.sampler.state_dict()

    def run_on_loop(self, make_coroutine: Any) -> tuple[bool, Any]:
        """Run ``make_coroutine()`` on the collector's event loop while it generates (e.g.
        a validation sharing the engine); (True, its result), or (False, None) when the
        loop is not running (not started yet, or finished): run it elsewhere then."""
        if not (self._thread.is_alive() and self._loop.is_running()):
            return False, None
        coroutine = self._guarded(make_coroutine())
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop closed in the meantime
            coroutine.close()
            return False, None
        try:
            return True, future.result()
        except concurrent.futures.CancelledError:  # the collector stopped meanwhile
            return False, None

    def close(self) -> None:
        """Stop producing (in-flight generations are discarded) and join the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._cancel)
            except RuntimeError:  # the loop closed in the meantime: the thread is ending
                pass
            self._thread.join(timeout=60)

    async def _guarded(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop, counted: weights wait until it ends."""
        self._validations += 1
        try:
            return await coroutine
        finally:
            self._validations -= 1
            if self._weights_arrived is not None:
                self._weights_arrived.set()  # a collection may be waiting to apply weights

    def _done(self) -> bool:
        return not self._thread.is_alive() or self._loop.is_closed()

    # ------------------------------------------------------------------ collector side

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._run())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # handed to the trainer by next_collection
            with self._lock:
                self._error = exc
                self._lock.notify_all()
        finally:  # discard what is still in flight (engine worker, rollouts)
            leftover = asyncio.all_tasks(self._loop)
            for task in leftover:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
            self._loop.close()

    async def _run(self) -> None:
        self._weights_arrived = asyncio.Event()
        self._task = asyncio.current_task()
        if self.carry_over:
            await self._run_carrying()
            return
        for step in range(self.first_step, self.last_step + 1):
            if self._stopping.is_set():
                return
            idle = await self._wait_for_version(step - 1 - self.max_staleness)
            with self._lock:
                self._sampler_states = {s: v for s, v in self._sampler_states.items()
                                        if s >= step - self.max_staleness - 1}
                self._sampler_states[step] = self.sampler.state_dict()
            result = await self.runner.collect(step, self.num_rollouts)
            with self._lock:
                self._ready[step] = result
                self._engine_idle_s[step] = idle
                self._lock.notify_all()

    async def _wait_for_version(self, oldest_allowed: int) -> float:
        """Take the newest published weights; wait while the engine's are too old.
        Returns the seconds the engine sat idle waiting. While a validation shares the
        engine, it generates: weights wait for it to end."""
        assert self._weights_arrived is not None
        start = time.perf_counter()
        while True:
            self._weights_arrived.clear()
            keeps = self._keeps_versions()  # LoRA: running requests keep their adapter
            if keeps or not self._validations:
                self._apply_pending(in_flight=keeps)
                if engine_version(self.engine) >= oldest_allowed:
                    return time.perf_counter() - start
            await self._weights_arrived.wait()

    def _on_weights(self, version: int, snapshot: dict[str, torch.Tensor]) -> None:
        """On the collector's loop: keep the newest weights; apply them at once when
        in-flight updates are on (a loop callback runs between two decode steps)."""
        if self._pending is None or version > self._pending[0]:
            self._pending = (version, snapshot)
        if self.inflight_updates or self._keeps_versions():
            try:
                self._apply_pending(in_flight=True)
            except Exception as exc:  # a loop callback's error would only be logged
                self._stop_with(exc)
                return
        assert self._weights_arrived is not None
        self._weights_arrived.set()

    def _stop_with(self, error: BaseException) -> None:
        """Hand ``error`` to the trainer (its next :meth:`next_collection` raises it) and
        stop collecting: a failed weight sync must stop the run, not leave it waiting
        for weights that never arrive."""
        with self._lock:
            self._error = self._error or error
            self._lock.notify_all()
        self._cancel()

    def _apply_pending(self, in_flight: bool) -> None:
        if self._pending is None:
            return
        version, snapshot = self._pending
        self._pending = None
        self.engine.update_weights(snapshot.items(), version, in_flight=in_flight)

    def _keeps_versions(self) -> bool:
        """A LoRA engine installs each adapter version beside the ones running requests
        use: new adapters go in at once, whatever runs (``agentrl.engines.adapters``)."""
        return bool(getattr(self.engine, "keeps_adapter_versions", False))

    # ------------------------------------------------------------------ carry-over

    async def _run_carrying(self) -> None:
        """Start each draw as soon as the bound allows (two in play), hand each collection
        over once due (``agentrl.rollout.carry_over``)."""
        assert self._weights_arrived is not None
        step, self._idle_since = self.first_step, time.perf_counter()
        while step <= self.last_step:
            if self._stopping.is_set():
                return
            self._weights_arrived.clear()
            keeps = self._keeps_versions()  # LoRA: running requests keep their adapter
            if keeps or not (self._running or self._validations):
                self._apply_pending(in_flight=keeps)
            self._start_draws(step)
            self._start_queued()
            with self._lock:
                groups = self._pool.take(step)
            if groups is None:
                await self._weights_arrived.wait()  # a group ended, or weights arrived
                continue
            self._hand_over(step, groups)
            step += 1

    def _start_draws(self, step: int) -> None:
        """Draw the tasks of collections up to ``step + 1`` whose bound the engine's
        weights meet, and queue their groups."""
        while self._next_draw <= min(step + 1, self.last_step):
            draw, version = self._next_draw, engine_version(self.engine)
            if version < draw - 1 - self.max_staleness:
                return
            with self._lock:  # the sampler state before it, for checkpoints
                self._sampler_states[draw] = self.sampler.state_dict()
                tasks = self.runner.draw(draw, self.num_rollouts)
                self._queue.extend(self._pool.add_draw(draw, tasks, version))
                self._next_draw += 1
            self._max_running = self._max_running or len(tasks)

    def _start_queued(self) -> None:
        """Start queued groups while fewer than one draw's worth run."""
        while self._queue and len(self._running) < self._max_running:
            pending = self._queue.popleft()
            with self._lock:
                self._pool.started(pending, engine_version(self.engine))
            self._note_busy()
            task = asyncio.ensure_future(self.runner.collect_group(
                pending.group_id, pending.env, pending.task_seed))
            self._running.add(task)
            task.add_done_callback(self._on_group_done)

    def _on_group_done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        if task.cancelled():
            return
        if task.exception() is not None:
            self._stop_with(task.exception())
            return
        with self._lock:
            self._pool.complete(task.result())
        if not self._running:
            self._idle_since = time.perf_counter()
        assert self._weights_arrived is not None
        self._weights_arrived.set()

    def _note_busy(self) -> None:
        """The engine gets work: end its idle time."""
        if self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None

    def _hand_over(self, step: int, groups: list[Any]) -> None:
        if self._idle_since is not None:  # idle until now counts for this collection
            self._note_busy()
            self._idle_since = time.perf_counter()
        idle, self._idle_s = self._idle_s, 0.0
        result = CollectionResult(
            groups=groups, carried_groups=sum(draw_of(g.group_id) < step for g in groups),
            **self.runner.take_played())
        with self._lock:
            self._ready[step] = result
            self._engine_idle_s[step] = idle
            self._lock.notify_all()

    def _resume_state(self, step: int) -> dict[str, Any]:
        """(Under the lock) the sampler state before the first draw with a group not
        trained before ``step``, and which of its groups were (``CarryPool``)."""
        first, trained = self._pool.resume_point(step, self._next_draw)
        state = (self._sampler_states[first] if first < self._next_draw
                 else self.sampler.state_dict())
        return {**state, "carry_over": {"draw": first, "trained": trained}}

    def _forget_before(self, step: int) -> None:
        """(Under the lock) drop what no checkpoint from ``step`` on can need."""
        first, _ = self._pool.resume_point(step, self._next_draw)
        self._pool.forget_before(first)
        self._sampler_states = {d: v for d, v in self._sampler_states.items() if d >= first}

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


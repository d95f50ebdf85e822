"""Asynchronous collection in a process of its own, apart from the trainer.

With ``rollout.collector = "process"`` (and ``max_staleness >= 1``) rank 0 starts one child
process that builds the engine replicas, the environments, the runner and an
:class:`~agentrl.rollout.async_collector.AsyncCollector` of its own, and answers the
trainer's calls over a pipe. Environment, tool, tokenizer and engine code then never holds
the trainer's interpreter lock nor runs on its core: with the thread collector their
Python work slows every step the trainer takes while they run.

:class:`ProcessCollector` has the thread collector's interface (``next_collection``,
``publish``, ``sampler_state_before``, ``close``) plus what the trainer otherwise asks its
own engine (``needs_initial_sync``, ``adopt_version``, ``evaluate``). The trainer's calls
are sequential, so the child serves them one at a time while its collector thread keeps
generating ahead. Weights travel as CPU tensors in shared memory (torch.multiprocessing),
packed into a few flat buffers (:class:`PackedWeights`).
If the child dies, the next call raises with its exit code; if the trainer dies, the
child sees the pipe close and exits.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing.connection
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch

from agentrl.rollout.async_collector import POLL_S
from agentrl.rollout.runner import CollectionResult

PACK_BYTES = 64 * 2**20
"""Bytes of weights one shared buffer holds at most (:func:`pack_weights`)."""
START_TIMEOUT_S = 600.0
"""Seconds the child may take to build its replicas and environments (vLLM servers and
sandboxes can take minutes)."""


@dataclass
class PackedWeights:
    """Named weights in a few flat CPU buffers: the pipe shares each buffer's memory with
    the child through one file descriptor instead of one per tensor (the async bench's
    27-tensor model: 11.5 -> 2.6 ms a publish, copy and round trip included, much of it
    on the engine's core)."""

    buffers: list[torch.Tensor] = field(default_factory=list)
    entries: list[tuple[str, int, int, tuple[int, ...]]] = field(default_factory=list)
    """(name, buffer index, first element, shape) per weight."""


def pack_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> PackedWeights:
    """Consecutive weights of one dtype concatenated into buffers of at most
    ``PACK_BYTES`` (a larger weight alone in its own), consumed as they come so that at
    most one buffer's worth exists twice."""
    packed, pending, size = PackedWeights(), [], 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            packed.buffers.append(torch.cat([t.reshape(-1) for _, t in pending]))
            offset = 0
            for name, tensor in pending:
                packed.entries.append((name, len(packed.buffers) - 1, offset,
                                       tuple(tensor.shape)))
                offset += tensor.numel()
        pending, size = [], 0

    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and (tensor.dtype != pending[0][1].dtype or size + nbytes > PACK_BYTES):
            flush()
        pending.append((name, tensor))
        size += nbytes
    flush()
    return packed


def unpack_weights(packed: PackedWeights) -> dict[str, torch.Tensor]:
    """The named weights of :func:`pack_weights`, as views into its buffers."""
    return {name: packed.buffers[index][start:start + math.prod(shape)].view(shape)
            for name, index, start, shape in packed.entries}


class ProcessCollector:
    """The asynchronous collector, run in a child process (see the module docstring)."""

    def __init__(self, config: Any, model_dir: Path, sampler_state: dict[str, Any],
                 first_step: int, num_training_gpus: int = 1) -> None:
        """Start the child: it builds the replicas from ``model_dir``, a sampler restored
        from ``sampler_state``, and produces collections ``first_step ..
        train.num_steps``. Returns once the child is ready; raises what it raised."""
        context = torch.multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=serve_collections, name="agentrl-collector", daemon=True,
            args=(child_conn, config, str(model_dir), sampler_state, first_step,
                  num_training_gpus, torch.get_num_threads()))
        self._process.start()
        child_conn.close()
        self.needs_initial_sync: bool = self._reply("start", START_TIMEOUT_S)

    def next_collection(self, step: int) -> CollectionResult:
        """The collection of ``step``, once due (``AsyncCollector.next_collection``)."""
        payload = self._call("collection", step)
        return msgspec.msgpack.decode(payload, type=CollectionResult)

    @staticmethod
    def snapshot(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> PackedWeights:
        """The weights for :meth:`publish`, copied to the CPU one tensor at a time as
        they are gathered (the child gets CPU tensors anyway, so no whole copy of the
        policy is ever made on the trainer's GPU) and packed (:func:`pack_weights`)."""
        return pack_weights((name, tensor.detach().to("cpu")) for name, tensor in named_tensors)

    def publish(self, snapshot: PackedWeights, version: int) -> None:
        """Hand the weights of ``version`` (a :meth:`snapshot`) to the child's engine;
        returns once sent."""
        self._send("weights", version, snapshot)

    def sampler_state_before(self, step: int) -> dict[str, Any]:
        """The child's sampler state from just before collection ``step`` drew a task."""
        return self._call("sampler_state", step)

    def adopt_version(self, version: int) -> None:
        """Replicas that loaded the checkpoint of step ``version`` serve it."""
        self._call("adopt_version", version)

    def evaluate(self, num_tasks: int) -> dict[str, list[float]]:
        """Per environment, the correctness of each of ``num_tasks`` held-out tasks, by
        the child's engine (sharing it with the generation running ahead, as the thread
        collector does)."""
        return self._call("evaluate", num_tasks)

    def close(self) -> None:
        """Stop the child (in-flight generations are discarded); kill it if it hangs."""
        if self._process.is_alive():
            try:
                self._call("close")
            except (RuntimeError, OSError):
                pass
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    # ------------------------------------------------------------------ the pipe

    def _call(self, kind: str, *args: Any) -> Any:
        self._send(kind, *args)
        return self._reply(kind)

    def _send(self, kind: str, *args: Any) -> None:
        try:
            self._conn.send((kind, *args))
        except OSError as exc:  # a broken or reset pipe: the child died
            raise self._died(kind) from exc

    def _reply(self, kind: str, timeout_s: float | None = None) -> Any:
        waited = 0.0
        while not self._conn.poll(POLL_S):
            waited += POLL_S
            if not self._process.is_alive():
                raise self._died(kind)
            if timeout_s is not None and waited >= timeout_s:
                self._process.kill()
                raise RuntimeError(f"the rollout collector process did not answer '{kind}' "
                                   f"within {timeout_s:.0f} s; it was killed")
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:  # the child died (closed or reset pipe)
            raise self._died(kind) from exc
        if status == "error":
            raise RuntimeError(f"the rollout collector process failed on '{kind}':\n{value}")
        return value

    def _died(self, kind: str) -> RuntimeError:
        self._process.join(timeout=5)
        return RuntimeError(f"the rollout collector process exited (code "
                            f"{self._process.exitcode}) before answering '{kind}'; its "
                            "error, if any, is on stderr above")


def serve_collections(conn: multiprocessing.connection.Connection, config: Any,
                      model_dir: str, sampler_state: dict[str, Any], first_step: int,
                      num_training_gpus: int, num_threads: int) -> None:
    """The child's main: build the rollout side, then answer the trainer's calls until it
    says close or goes away."""
    torch.set_num_threads(num_threads)
    try:
        side = _RolloutSide(config, Path(model_dir), sampler_state, first_step,
                            num_training_gpus)
        conn.send(("ok", side.engine.needs_initial_sync))
    except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    code = 0
    try:
        _answer_calls(conn, side)
    except BaseException:  # noqa: BLE001 - e.g. the pipe broke mid-reply: say why, exit 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            side.collector.close()
        finally:
            os._exit(code)  # skip interpreter teardown: engine threads may hold tensors


def _answer_calls(conn: multiprocessing.connection.Connection, side: _RolloutSide) -> None:
    """Answer the trainer's calls in order until it says close or goes away. Weights get
    no reply (the trainer does not wait for the engine); a failure to take them is the
    reply to the next call."""
    failed_weights = None
    while True:
        try:
            kind, *args = conn.recv()
        except EOFError:  # the trainer is gone
            return
        if kind == "weights":
            try:
                side.collector.publish(unpack_weights(args[1]), args[0])
            except BaseException:  # noqa: BLE001 - reported with the next reply
                failed_weights = traceback.format_exc()
            continue
        try:
            if failed_weights is not None:
                failed_weights, why = None, failed_weights
                raise RuntimeError(f"taking published weights failed:\n{why}")
            reply = ("ok", side.answer(kind, *args))
        except BaseException:  # noqa: BLE001 - reported to the trainer
            reply = ("error", traceback.format_exc())
        conn.send(reply)
        if kind == "close":
            return


class _RolloutSide:
    """What the child holds: tokenizer, replicas, runner and the thread collector."""

    def __init__(self, config: Any, model_dir: Path, sampler_state: dict[str, Any],
                 first_step: int, num_training_gpus: int) -> None:
        from agentrl.engines.build import build_engines
        from agentrl.model import load_tokenizer, read_args
        from agentrl.rollout.build import build_collector, build_runner, build_sampler
        from agentrl.rollout.template_check import prepare_chat

        self.config = config
        self.tokenizer = load_tokenizer(model_dir)
        prepare_chat(self.tokenizer, config.model)  # the trainer printed it
        self.engine = build_engines(config, model_dir, self.tokenizer,
                                    read_args(model_dir).max_position_embeddings,
                                    num_training_gpus=num_training_gpus)
        sampler = build_sampler(config)
        sampler.load_state_dict(sampler_state)
        runner = build_runner(config, self.engine, self.tokenizer, sampler)
        self.collector = build_collector(config, runner, sampler, first_step,
                                         sampler_state.get("carry_over"))
        self._loop = asyncio.new_event_loop()

    def answer(self, kind: str, *args: Any) -> Any:
        """The reply to one call of the trainer."""
        if kind == "collection":
            return msgspec.msgpack.encode(self.collector.next_collection(args[0]))
        if kind == "sampler_state":
            return self.collector.sampler_state_before(args[0])
        if kind == "adopt_version":
            return self.engine.adopt_version(args[0])
        if kind == "evaluate":
            return self._evaluate(args[0])
        if kind == "close":
            return None
        raise ValueError(f"unknown call '{kind}' to the rollout collector process")

    def _evaluate(self, num_tasks: int) -> dict[str, list[float]]:
        from agentrl.rollout.evaluation import evaluate_tasks

        def make() -> Any:
            return evaluate_tasks(self.engine, self.tokenizer, self.config, num_tasks)

        done, accuracy = self.collector.run_on_loop(make)
        return accuracy if done else self._loop.run_until_complete(make())

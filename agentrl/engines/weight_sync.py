"""Pushing new weights to replicas in buckets, from a one-pass (name, tensor) iterator.

A sync is a session on every replica (:class:`WeightReceiver`): ``start_weight_update``,
then ``load_bucket`` once per bucket, then ``finish_weight_update(version)``, the same
lifecycle as vLLM's weight-transfer API. :func:`push_weights` reads the trainer's pairs
once, groups them into buckets of at most ``bucket_bytes``, and hands each bucket to every
replica concurrently before reading the next: memory holds one bucket, never the model.
Any failure or timeout raises :class:`WeightSyncError` naming the replica.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch

from agentrl.engines.interface import NamedTensors, WeightSyncError, named_pairs

Bucket = list[tuple[str, torch.Tensor]]
DEFAULT_BUCKET_BYTES = 256 * 2**20
T = TypeVar("T")


class WeightReceiver(Protocol):
    """One replica's side of a sync, as the trainer drives it."""

    name: str
    """Shown in errors: "local replica 0", "http://host:port", ..."""
    sync_timeout_s: float
    """Seconds one call of a sync may take before the sync fails."""

    def start_weight_update(self, in_flight: bool = False) -> None:
        """Begin a session (refused while generations are in flight unless ``in_flight``
        and the replica can swap weights between two decode steps)."""
        ...

    def load_bucket(self, bucket: Bucket) -> None:
        """Receive and load one bucket of (name, full tensor) pairs."""
        ...

    def finish_weight_update(self, version: int) -> None:
        """End the session: every parameter arrived; serve the weights as ``version``."""
        ...


def buckets(pairs: Iterable[tuple[str, torch.Tensor]], max_bytes: int,
            dtype: torch.dtype | None = None) -> Iterator[Bucket]:
    """Consecutive pairs grouped so a bucket holds at most ``max_bytes`` (a single larger
    tensor gets a bucket of its own), cast to ``dtype`` when given, read lazily."""
    bucket: Bucket = []
    size = 0
    for name, tensor in pairs:
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def push_weights(
    receivers: Sequence[WeightReceiver], named_tensors: NamedTensors, version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: torch.dtype | None = None,
    in_flight: bool = False,
) -> int:
    """Run one sync session on every receiver; returns the bytes sent to each.
    ``in_flight``: the receivers keep their running requests (asynchronous collection)."""
    if not receivers:
        raise ValueError("push_weights needs at least one replica")
    if in_flight:
        on_all(receivers, "start", lambda r: r.start_weight_update(in_flight=True))
    else:
        on_all(receivers, "start", lambda r: r.start_weight_update())
    sent = 0
    for bucket in buckets(named_pairs(named_tensors), bucket_bytes, dtype):
        on_all(receivers, "load", lambda r, b=bucket: r.load_bucket(b))
        sent += sum(t.numel() * t.element_size() for _, t in bucket)
    on_all(receivers, "finish", lambda r: r.finish_weight_update(version))
    return sent


def in_thread(fn: Callable[..., T], *args: Any) -> concurrent.futures.Future:
    """Run ``fn`` on a daemon thread: a call stuck past its deadline is abandoned and
    never blocks the trainer (nor its exit)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="weight-sync").start()
    return future


def on_all(receivers: Sequence[WeightReceiver], stage: str,
           call: Callable[[WeightReceiver], T]) -> list[T]:
    """``call`` on every receiver concurrently; the first failure or timeout raises
    WeightSyncError naming the replica and the stage."""
    futures = [(r, in_thread(call, r)) for r in receivers]
    results = []
    for receiver, future in futures:
        try:
            # each call enforces its own timeout; this bound catches one that does not
            results.append(future.result(timeout=2 * receiver.sync_timeout_s + 1.0))
        except concurrent.futures.TimeoutError:
            raise WeightSyncError(
                f"weight sync to {receiver.name} timed out in {stage} after "
                f"{receiver.sync_timeout_s:g} s; its weights are undefined: restart it "
                "(or raise rollout.weight_sync_timeout_s)") from None
        except Exception as exc:
            what = str(exc) if isinstance(exc, WeightSyncError) else (
                f"{type(exc).__name__}: {exc}")
            raise WeightSyncError(f"weight sync to {receiver.name} failed in {stage}: "
                                  f"{what}") from exc
    return results

"""The built-in PyTorch inference engine: the native model, a KV cache, continuous batching.

Many rollouts call ``generate`` concurrently from one asyncio loop. Each call queues a
request; one background task (started on demand, ending when idle) repeatedly

1. admits queued requests into free cache slots and prefills each prompt (one forward per
   prompt, since prompts differ in length), sampling its first token;
2. decodes every active slot by one token in a single batched forward ``[N, 1]``;
3. resolves the futures of the requests that finished.

Every request samples with its own ``torch.Generator`` (seeded by ``SamplingParams.seed``
or the engine's counter), so what a request draws does not depend on which other requests
shared its batch. Log-probs follow ``agentrl.engines.sampling``: log_softmax(logits / T)
of the sampled token, the distribution the trainer recomputes at the same temperature.

The forward runs on the event loop's thread: while a step computes, no environment code
runs on the loop (environments run their ``step`` in worker threads).

Batch invariance (``batch_invariant=True``, set by ``train.deterministic``): batched
matrix products round differently for different batch sizes (on CPU a one-row product is
a GEMV, several rows a GEMM; attention's reductions follow the longest row), so a
request's logits, and rarely its tokens, depend on which requests shared its decode
steps, which depends on timing. In this mode every decode step runs all
``max_batch_size`` slots (free ones on a dummy token) over the whole ``max_len`` span, so
the forward's shapes never change and each request's tokens and log-probs are the same
bits whatever else runs. Prefill is one prompt per forward in both modes. The price is
decode work for idle slots: ``bench/batch_invariance.py`` measures it.

Weight sync is a session (``start_weight_update`` → ``load_bucket`` per bucket →
``finish_weight_update``, see ``agentrl.engines.weight_sync``): tensors are copied into
the engine's own model one bucket at a time, and the version is bumped only once every
parameter arrived. ``sleep`` frees the KV cache (the analogue of vLLM's sleep mode for a
replica colocated with training); the next request allocates it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engines.interface import (
    Generation,
    NamedTensors,
    SamplingParams,
    WeightSyncError,
    next_version,
)
from agentrl.engines.sampling import sample_token


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    generator: torch.Generator
    max_tokens: int
    slot: int = -1
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    version: int = 0
    """The adapter version the request runs under (LoRA engines; set on admission)."""


class TorchEngine:
    """An ``InferenceEngine`` over a native ``CausalLM`` with ``forward_cached``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        max_batch_size: int = 16,
        max_len: int = 4096,
        seed: int = 0,
        batch_invariant: bool = False,
        name: str = "torch engine",
        adapters: Any = None,
    ) -> None:
        """``max_batch_size`` cache slots of ``max_len`` tokens (prompt + generated) each;
        ``batch_invariant``: outputs independent of batching (module docstring). The engine
        generates with ``model``; a replica that must not share the trainer's parameters
        gets its own copy (``agentrl.engines.build``). ``adapters``: an
        ``AdapterVersions`` on ``model`` (a LoRA run): syncs then carry adapter tensors
        only and never wait for running requests (``agentrl.engines.adapters``)."""
        if max_batch_size < 1 or max_len < 2:
            raise ValueError(
                f"TorchEngine needs max_batch_size >= 1 and max_len >= 2, got "
                f"{max_batch_size} and {max_len}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_len = max_len
        self.batch_invariant = batch_invariant
        self._seed_counter = itertools.count(seed * 1_000_003)
        self._cache: Any = None
        self._pending: list[_Request] = []
        self._active: dict[int, _Request] = {}
        self._worker: asyncio.Task | None = None
        self.num_forwards = 0
        """Forwards run so far (prefills + decode steps), for benchmarks and tests."""
        self.name = name
        self.weight_version = 0
        """Policy version of the weights (completed training steps); every sampled token
        records the version it came from."""
        self.sync_timeout_s = 300.0
        self._receiving: set[str] | None = None
        self.adapters = adapters

    @property
    def keeps_adapter_versions(self) -> bool:
        """True for a LoRA engine: a sync installs a new adapter version beside the ones
        running requests use, so it may come at any time."""
        return self.adapters is not None

    # ------------------------------------------------------------------ public API

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, key: str | None = None
    ) -> Generation:
        """Complete one prompt; concurrent calls are decoded together in one batch (one
        engine has one cache, so ``key`` changes nothing here)."""
        self._check_request(prompt_ids, params)
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else next(self._seed_counter))
        request = _Request(
            prompt_ids=list(prompt_ids),
            params=params,
            future=asyncio.get_running_loop().create_future(),
            generator=generator,
            # a slot holds prompt + generated tokens; the last sampled token is never fed back
            max_tokens=min(params.max_tokens, self.max_len - len(prompt_ids) + 1),
        )
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        return await request.future

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *,
                       in_flight: bool = False) -> None:
        """Copy new weights (HF names) into the model in place, bucket by bucket, and serve
        them as ``version``. Refused while requests are in flight unless ``in_flight``: an
        in-flight update (called on the engine's event loop, so between two decode steps)
        lets running requests continue under the new weights, with the KV cache their
        earlier tokens left; each token records the version it came from."""
        from agentrl.engines.weight_sync import push_weights

        push_weights([self], named_tensors, next_version(self.weight_version, version),
                     in_flight=in_flight)

    def start_weight_update(self, in_flight: bool = False) -> None:
        """Begin a sync session: between collections, or ``in_flight`` between two decode
        steps of running requests."""
        if self.adapters is not None:
            self.adapters.start()
            return
        if not in_flight:
            self._require_idle("update_weights")
        self._receiving = set()

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Copy one bucket of (name, tensor) pairs into the model's parameters (a LoRA
        engine: into the adapter version being received)."""
        if self.adapters is not None:
            self.adapters.load(bucket)
            return
        if self._receiving is None:
            raise WeightSyncError(f"{self.name}: load_bucket outside a weight update")
        targets = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in bucket:
                if name not in targets or targets[name].shape != tensor.shape:
                    got = tuple(tensor.shape)
                    want = tuple(targets[name].shape) if name in targets else "no such name"
                    raise ValueError(f"{self.name}: tensor {name} {got} does not match the "
                                     f"engine's model ({want}); send HF names of a model of "
                                     "the same size")
                targets[name].copy_(tensor)
                self._receiving.add(name)

    def finish_weight_update(self, version: int) -> None:
        """End the session: every parameter must have arrived; then serve ``version``."""
        if self.adapters is not None:
            self.adapters.finish(version, self._versions_in_use())
            if self.adapters.move_running:  # in-flight updates: running requests move too
                for request in self._active.values():
                    request.version = version
            self.weight_version = version
            return
        received, self._receiving = self._receiving, None
        if received is None:
            raise WeightSyncError(f"{self.name}: finish without a started weight update")
        missing = sorted(n for n, _ in self.model.named_parameters() if n not in received)
        if missing:
            raise ValueError(f"{self.name}: the weight update lacks {len(missing)} "
                             f"parameters, e.g. {missing[:3]}; send every parameter")
        self.weight_version = version

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (colocated with training: give the memory back); ``level``
        is accepted for symmetry with vLLM, weights stay in place."""
        self._require_idle("sleep")
        self._cache = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to do: the next request allocates the KV cache again."""

    @property
    def is_sleeping(self) -> bool:
        """True while the KV cache is freed."""
        return self._cache is None

    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache takes once allocated (``max_batch_size`` × ``max_len``)."""
        from agentrl.model.kv_cache import kv_cache_bytes

        args = self.model.config
        return kv_cache_bytes(args.num_hidden_layers, self.max_batch_size, self.max_len,
                              args.num_key_value_heads, args.head_dim,
                              self.model.dtype.itemsize)

    # ------------------------------------------------------------------ internals

    def _require_idle(self, what: str) -> None:
        # requests whose caller was cancelled (dynamic sampling stops a collection early)
        # leave when the batching loop next runs; they hold nothing that matters now
        self._pending = [r for r in self._pending if not r.future.done()]
        for slot, request in list(self._active.items()):
            if request.future.done():
                del self._active[slot]
        if self._pending or self._active:
            raise RuntimeError(
                f"{self.name}: {what} called while generations are in flight; "
                "sync weights between collections"
            )

    def _versions_in_use(self) -> set[int]:
        return {r.version for r in self._active.values()}

    def _rows_under(self, versions: list[int]) -> Any:
        """The forward's rows run under these adapter versions (no-op without LoRA)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.selected(versions)

    def _check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; give at least one token id")
        if len(prompt_ids) >= self.max_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens does not fit the engine's max_len "
                f"{self.max_len}; raise max_len or compact the context"
            )
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens is {params.max_tokens}; need >= 1")
        if params.stop and self.tokenizer is None:
            raise ValueError(
                f"stop strings {params.stop!r} need a tokenizer to decode the output; "
                "pass tokenizer= to TorchEngine or use stop_token_ids"
            )

    async def _run(self) -> None:
        """The batching loop; ends when nothing is pending or active."""
        try:
            while self._pending or self._active:
                with torch.inference_mode():
                    self._admit()
                    self._decode_step()
                self._resolve_finished()
                await asyncio.sleep(0)  # let rollouts queue new requests between steps
        except Exception as exc:  # fail every waiting caller rather than hang them
            for request in [*self._pending, *self._active.values()]:
                if not request.future.done():
                    request.future.set_exception(exc)
            self._pending.clear()
            self._active.clear()
            raise

    def _ensure_cache(self) -> Any:
        if self._cache is None:
            self._cache = self.model.new_kv_cache(self.max_batch_size, self.max_len)
        return self._cache

    def _admit(self) -> None:
        """Prefill queued prompts into free slots and sample their first token."""
        cache = self._ensure_cache()
        free = [s for s in range(self.max_batch_size) if s not in self._active]
        while self._pending and free:
            request = self._pending.pop(0)
            if request.future.done():  # cancelled while queued
                continue
            request.slot = free.pop(0)
            request.version = self.weight_version  # the newest weights (adapter version)
            cache.lengths[request.slot] = 0  # the slot's old contents are dead
            device = cache.lengths.device
            input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=device)
            slots = torch.tensor([request.slot], device=device)
            with self._rows_under([request.version]):
                logits = self.model.forward_cached(input_ids, slots, cache)
            self.num_forwards += 1
            self._active[request.slot] = request
            # sample on CPU: per-request generators live there, and results stay device-free
            self._append_sample(request, logits[0, -1].float().cpu())

    def _decode_step(self) -> None:
        """Feed every active slot's last token in one batched forward."""
        running = [r for r in self._active.values() if r.finish_reason is None]
        if not running:
            return
        cache = self._cache
        if self.batch_invariant:  # every slot, whole span: shapes never change
            by_slot = {r.slot: r for r in running}
            for slot in range(self.max_batch_size):
                if slot not in by_slot:  # free or finished: its cache is dead, reuse pos 0
                    cache.lengths[slot] = 0
            tokens = [by_slot[s].token_ids[-1] if s in by_slot else 0
                      for s in range(self.max_batch_size)]
            slot_ids, span = list(range(self.max_batch_size)), self.max_len
        else:
            tokens, slot_ids, span = [r.token_ids[-1] for r in running], [
                r.slot for r in running], None
        device = cache.lengths.device
        input_ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=device)
        slots = torch.tensor(slot_ids, dtype=torch.long, device=device)
        by_slot = {r.slot: r.version for r in running}
        with self._rows_under([by_slot.get(s, self.weight_version) for s in slot_ids]):
            last_logits = self.model.forward_cached(input_ids, slots, cache, span)[:, -1]
        self.num_forwards += 1
        last_logits = last_logits.float().cpu()  # one transfer per step, not per request
        row_of = {slot: row for row, slot in enumerate(slot_ids)}
        for request in running:
            self._append_sample(request, last_logits[row_of[request.slot]])

    def _append_sample(self, request: _Request, logits_v: torch.Tensor) -> None:
        params = request.params
        token, logprob = sample_token(logits_v, params.temperature, params.top_p,
                                      request.generator)
        request.token_ids.append(token)
        request.logprobs.append(logprob)
        request.versions.append(request.version if self.adapters is not None
                                else self.weight_version)
        if token in params.stop_token_ids or self._hit_stop_string(request):
            request.finish_reason = "stop"
        elif len(request.token_ids) >= request.max_tokens:
            request.finish_reason = "length"

    def _hit_stop_string(self, request: _Request) -> bool:
        if not request.params.stop:
            return False
        # decode a tail long enough to contain any stop string that just completed
        window = max(len(s) for s in request.params.stop) + 8
        text = self.tokenizer.decode(request.token_ids[-window:])
        return any(stop in text for stop in request.params.stop)

    def _resolve_finished(self) -> None:
        for slot, request in list(self._active.items()):
            if request.finish_reason is None and not request.future.cancelled():
                continue
            del self._active[slot]
            if self.adapters is not None:  # versions no running request uses any more
                self.adapters.keep(self._versions_in_use())
            if not request.future.done():  # the caller may have been cancelled
                request.future.set_result(
                    Generation(request.token_ids, request.logprobs, request.finish_reason,
                               versions=request.versions)
                )

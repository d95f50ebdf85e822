"""The built-in PyTorch inference engine: the native model, a KV cache, continuous batching.

Many rollouts call ``generate`` concurrently from one asyncio loop. Each call queues a
request; one background task (started on demand, ending when idle) repeatedly

1. admits queued requests into free cache slots: a prompt already prefilled (the other
   rollouts of a group) is copied from its slot with its last-position logits, a prompt
   continuing an idle slot's conversation (the same ``key``: the rollout's next turn)
   prefills only its new tokens there, the rest are prefilled together in one padded
   forward (``agentrl.engines.admission``); then every admitted request samples its
   first token;
2. decodes every running slot by one token in a single batched forward over a run of
   slots ``[N, 1]``, reading the cache in place, up to the longest filled position;
   sampling, stop checks and bookkeeping are tensor operations over all rows at once
   (``agentrl.engines.slot_table``), with Python work only when a request finishes;
3. resolves the futures of the requests that finished.

The KV cache is sized to what the admitted requests can reach (prompt + max_tokens) and
grows on demand up to ``max_len`` (``agentrl.model.kv_cache``). When few requests are
left in a wide run of slots, the running ones move down (their cache copied) so a decode
step never computes many empty rows.

Every request draws its random numbers from its own ``torch.Generator`` (seeded by
``SamplingParams.seed`` or the engine's counter) when it is admitted, one per token, so
what a request draws does not depend on which other requests shared its batch. Log-probs
follow ``agentrl.engines.sampling``: log_softmax(logits / T) of the sampled token, the
distribution the trainer recomputes at the same temperature.

The forward runs on the event loop's thread: while a step computes, no environment code
runs on the loop (environments run their ``step`` in worker threads).

Batch invariance (``batch_invariant=True``, set by ``train.deterministic``): batched
matrix products round differently for different batch sizes (on CPU a one-row product is
a GEMV, several rows a GEMM; attention's reductions follow the longest row), so a
request's logits, and rarely its tokens, depend on which requests shared its decode
steps, which depends on timing. In this mode every decode step runs all
``max_batch_size`` slots (free ones masked) over the whole ``max_len`` span, so the
forward's shapes never change and each request's tokens and log-probs are the same bits
whatever else runs. Prefill is then one prompt per forward, an identical prompt is still
copied (the same bits as its own prefill), and conversations are never continued from a
slot (a partial prefill rounds differently). The price is decode work for idle slots and
a cache of ``max_len`` positions: ``bench/batch_invariance.py`` measures it.

Weight updates (a sync session, ``sleep``) and LoRA adapter versions live in
``agentrl.engines.torch_weights``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import torch

from agentrl.engines.admission import Request, plan_admission, prefill, prefill_batches
from agentrl.engines.interface import (
    Generation,
    SamplingParams,
)
from agentrl.engines.sampling import sample_rows
from agentrl.engines.slot_table import SlotTable
from agentrl.engines.torch_weights import TorchWeightUpdates
from agentrl.model.prepacked import prepack_linears
from agentrl.observe.profile import section


class TorchEngine(TorchWeightUpdates):
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
        self.share_prefixes = not batch_invariant
        """Decode reads a group's copied prompt once per step (``agentrl.model.cascade``)
        where that was measured faster: on a CPU. Never when batch invariant: which rows
        share a matmul would depend on the batch."""
        self.prepack_weights = True
        """Pack the model's float32 linear weights once per weight version on a CPU
        (``agentrl.model.prepacked``): every forward then skips repacking them."""
        self._seed_counter = itertools.count(seed * 1_000_003)
        self._cache: Any = None
        self._table: SlotTable | None = None
        self._pending: list[Request] = []
        self._admitting: list[Request] = []
        """Requests taken from the queue by the admission round in progress."""
        self._active: dict[int, Request] = {}
        """Admitted, unfinished requests by slot."""
        self._cancelled: list[Request] = []
        self._num_stop_strings = 0
        """Active requests with stop strings (checked by decoding, one by one)."""
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
        """Complete one prompt; concurrent calls are decoded together in one batch.
        ``key`` (the rollout's id): a later prompt with the same key that extends this
        one reuses its cached prefix (module docstring)."""
        self._check_request(prompt_ids, params)
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else next(self._seed_counter))
        request = Request(
            prompt_ids=list(prompt_ids),
            params=params,
            future=asyncio.get_running_loop().create_future(),
            generator=generator,
            # a slot holds prompt + generated tokens; the last sampled token is never fed back
            max_tokens=min(params.max_tokens, self.max_len - len(prompt_ids) + 1),
            key=key,
        )
        request.future.add_done_callback(
            lambda f, r=request: self._cancelled.append(r) if f.cancelled() else None)
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        return await request.future

    # ------------------------------------------------------------------ internals

    def _require_idle(self, what: str) -> None:
        # requests whose caller was cancelled (dynamic sampling stops a collection early)
        # leave when the batching loop next runs; they hold nothing that matters now
        self._pending = [r for r in self._pending if not r.future.done()]
        self._drop_cancelled()
        if self._pending or self._active:
            raise RuntimeError(
                f"{self.name}: {what} called while generations are in flight; "
                "sync weights between collections"
            )

    def _rows_under(self, versions: list[int]) -> Any:
        """The forward's rows run under these adapter versions (no-op without LoRA)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.selected(versions)

    def _slots_under(self, hi: int) -> Any:
        """Decode rows 0..hi-1 under their slots' versions; a row without a running
        request takes a running one's version (no extra version computed)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        fill = next(iter(self._active.values())).version
        return self._rows_under([self._active[s].version if s in self._active else fill
                                 for s in range(hi)])

    def _check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """ValueError for a request that would fail inside a batch (and fail the others
        with it): ids outside the vocabulary, a prompt too long, empty stop strings."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; give at least one token id")
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and not 0 <= min(prompt_ids) <= max(prompt_ids) < vocab:
            bad = next(t for t in prompt_ids if not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary "
                             f"[0, {vocab}); send ids of this model's tokenizer")
        if len(prompt_ids) >= self.max_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens does not fit the engine's max_len "
                f"{self.max_len}; raise max_len or compact the context"
            )
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens is {params.max_tokens}; need >= 1")
        if any(not stop for stop in params.stop):
            raise ValueError("an empty stop string would stop every generation at once; "
                             "drop it")
        if params.stop and self.tokenizer is None:
            raise ValueError(
                f"stop strings {params.stop!r} need a tokenizer to decode the output; "
                "pass tokenizer= to TorchEngine or use stop_token_ids"
            )

    async def _run(self) -> None:
        """The batching loop; ends when nothing is pending or active."""
        try:
            self._pack()
            while self._pending or self._active:
                self._drop_cancelled()
                with torch.inference_mode():
                    with section("engine/prefill"):
                        self._admit()
                    self._decode_step()
                await asyncio.sleep(0)  # let rollouts queue new requests between steps
        except Exception as exc:  # fail every waiting caller rather than hang them
            for request in [*self._admitting, *self._pending, *self._active.values()]:
                if not request.future.done():
                    request.future.set_exception(exc)
            self._pending.clear()
            self._active.clear()
            self._admitting = []
            self._cache = self._table = None
            self._num_stop_strings = 0
            raise

    def _pack(self) -> None:
        """Pack the weights that changed since they were last packed (none after the
        first time in a collection: the check is a pointer and a counter per weight)."""
        if self.prepack_weights:
            prepack_linears(self.model)

    def _ensure_cache(self, positions: int) -> tuple[Any, SlotTable]:
        """The cache (room for ``positions`` per slot; all of ``max_len`` when batch
        invariant) and the slot table, created on first use."""
        if self._cache is None:
            capacity = self.max_len if self.batch_invariant else max(positions, 1)
            self._cache = self.model.new_kv_cache(self.max_batch_size, self.max_len, capacity)
            self._table = SlotTable(self.max_batch_size, self._cache.lengths.device)
        self._cache.ensure_capacity(positions)
        assert self._table is not None
        return self._cache, self._table

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        """Give queued requests slots and their prompts' cache; sample their first token."""
        room = self.max_batch_size - len(self._active)
        admitted = self._admitting = []  # answered by _run's failure path if this raises
        while self._pending and len(admitted) < room:
            request = self._pending.pop(0)
            if not request.future.done():  # else: cancelled while queued
                admitted.append(request)
        if not admitted:
            return
        for request in admitted:
            request.version = self.weight_version  # the newest weights (adapter version)
        cache, table = self._ensure_cache(
            max(len(r.prompt_ids) + r.max_tokens - 1 for r in admitted))
        plan = plan_admission(admitted, cache, table, self.batch_invariant)
        first = [(r, logits) for r, logits in plan.copied]
        first += self._prefill(plan.compute)
        for request, leader in plan.second:  # heads the first forwards computed
            cache.copy_prefix(leader.slot, request.slot, request.shared_head)
        first += self._prefill([(r, r.shared_head) for r, _ in plan.second])
        leader_logits = {id(r): logits for r, logits in first}
        for request, leader in plan.followers:
            cache.copy_prefix(leader.slot, request.slot, len(request.prompt_ids))
            first.append((request, leader_logits[id(leader)]))
        for request, _ in first:
            table.start(request.slot, request, request.version)
            self._active[request.slot] = request
            self._num_stop_strings += bool(request.params.stop)
        rows = torch.tensor([r.slot for r, _ in first], device=table.device)
        self._sample(rows, torch.stack([logits for _, logits in first]))
        self._admitting = []

    def _prefill(self, compute: list[tuple[Request, int]]) -> list[tuple[Request, Any]]:
        """Prefill ``compute`` (request, positions already cached) in padded forwards;
        each request with its last-position logits."""
        first = []
        for batch in prefill_batches(compute, self.batch_invariant):
            with self._rows_under([r.version for r, _ in batch]):
                first += prefill(self.model, batch, self._cache, self._table)
            self.num_forwards += 1
        return first

    # ------------------------------------------------------------------ decoding

    def _decode_step(self) -> None:
        """Feed every running slot's last token in one batched forward."""
        table, cache = self._table, self._cache
        if not self._active or table is None:
            return
        if self.batch_invariant:  # every slot, whole span: shapes never change
            hi, span = self.max_batch_size, self.max_len
        else:
            hi, span = self._compact_slots(table, cache), None
        with section("engine/forward"):
            ids = table.last_token[:hi, None]
            with self._slots_under(hi):
                logits = self.model.forward_cached(
                    ids, range(hi), cache, span, num_new=table.running[:hi].long(),
                    share_prefixes=self.share_prefixes and not cache.lengths.is_cuda)[:, -1]
            self.num_forwards += 1
        with section("engine/sampling"):
            rows = torch.tensor(sorted(self._active), device=table.device)
            self._sample(rows, logits[rows])

    def _sample(self, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """Sample the next token of each slot in ``rows`` from its logits; finish those
        that stopped."""
        table = self._table
        assert table is not None
        tokens, logprobs = sample_rows(logits, table.temperature[rows], table.top_p[rows],
                                       table.uniforms(rows))
        finished = table.record(rows, tokens, logprobs)
        done = set(rows[finished].tolist()) if bool(finished.any()) else set()
        for slot in rows.tolist() if self._num_stop_strings else ():
            request = self._active[slot]
            if slot not in done and request.params.stop and _hits_stop_string(
                    self.tokenizer, request.params.stop, table.output(slot)[0]):
                done.add(slot)
        for slot in sorted(done):
            self._finish(slot)
        if done:
            self._release_versions()

    def _compact_slots(self, table: SlotTable, cache: Any) -> int:
        """Move running requests down into free slots when they sit sparsely in a wide
        run of slots; returns the run's length (highest running slot + 1)."""
        hi = max(self._active) + 1
        if 2 * len(self._active) >= hi or hi < 8:
            return hi
        for target in range(hi):
            source = max(self._active)
            if source <= target:
                break
            if target in self._active:
                continue
            table.claim(target)
            cache.copy_prefix(source, target, int(cache.lengths[source]))
            table.move(source, target)
            request = self._active.pop(source)
            request.slot = target
            self._active[target] = request
        return max(self._active) + 1

    def _finish(self, slot: int) -> None:
        """Resolve a finished request and leave its slot idle, holding its tokens."""
        request = self._active.pop(slot)
        table = self._table
        tokens, logprobs, versions = table.output(slot)
        stopped = tokens[-1] in request.params.stop_token_ids or (
            bool(request.params.stop) and _hits_stop_string(self.tokenizer,
                                                            request.params.stop, tokens))
        if request.params.stop:
            self._num_stop_strings -= 1
        table.release(slot, request.key, request.prompt_ids + tokens[:-1])
        if not request.future.done():  # the caller may have been cancelled
            request.future.set_result(Generation(
                tokens, logprobs, "stop" if stopped else "length", versions=versions))

    def _drop_cancelled(self) -> None:
        """Free the slots of requests whose caller was cancelled."""
        cancelled, self._cancelled = self._cancelled, []
        for request in cancelled:
            if self._active.get(request.slot) is request:
                del self._active[request.slot]
                self._num_stop_strings -= bool(request.params.stop)
                if self._table is not None:
                    self._table.release(request.slot, None, None)
        if cancelled:
            self._release_versions()


def _hits_stop_string(tokenizer: Any, stops: tuple[str, ...], tokens: list[int]) -> bool:
    """Whether the decoded tail of ``tokens`` (long enough for any stop string that just
    completed) contains one of ``stops``."""
    window = max(len(s) for s in stops) + 8
    text = tokenizer.decode(tokens[-window:])
    return any(stop in text for stop in stops)

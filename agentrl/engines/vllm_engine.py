"""vLLM as an ``InferenceEngine``: token ids in, token ids and log-probs out.

vLLM's ``AsyncLLM`` runs on its own thread and event loop, so callers on any loop can await
``generate``; ``update_weights`` is synchronous, with a timeout. Prompts go in as
``TokensPrompt`` ids, never text.

Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` gives the sampled
token's log-prob after temperature: ``log_softmax(logits / T)``, what the trainer
recomputes (greedy: ``log_softmax(logits)``). With ``top_p < 1`` vLLM renormalises over the
nucleus first, so it reports the truncated distribution's log-prob (TorchEngine does not).

Weight sync lives in ``agentrl.engines.vllm_weights``; whether vLLM is installed, requests
and outputs in its types and a checkpoint's shapes in ``agentrl.engines.vllm_setup``.
Colocated with the trainer, ``sleep``/``wake_up`` use vLLM's sleep mode (GPU only; the CPU
build has none).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from pathlib import Path
from typing import Any, Literal

from agentrl.engines.interface import (
    Generation,
    SamplingParams,
    WeightSyncError,
)
from agentrl.engines.vllm_setup import (
    EXTENSION_QUALNAME,
    _import_vllm,
    _quietly,
    from_vllm_output,
    read_checkpoint_shapes,
    to_vllm_params,
)
from agentrl.engines.vllm_weights import VLLMWeightUpdates

__all__ = ["VLLMEngine", "WeightSyncError"]


class VLLMEngine(VLLMWeightUpdates):
    """An ``InferenceEngine`` over vLLM's ``AsyncLLM``; build it with ``from_pretrained``."""

    def __init__(
        self,
        llm: Any,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        expected_shapes: dict[str, tuple[int, ...]],
        tied_embeddings: bool,
        sync_timeout_s: float,
        transfer_backend: str | None = None,
        world_size: int = 1,
        sleep_mode: bool = False,
        name: str = "vLLM engine",
        gpus: list[int] | None = None,
    ) -> None:
        """Wrap a started ``AsyncLLM`` living on ``loop`` (run by ``thread``);
        ``transfer_backend``: its weight-transfer backend (None: the file fallback)."""
        self._llm = llm
        self._loop = loop
        self._thread = thread
        self._expected_shapes = expected_shapes
        self._tied = tied_embeddings
        self.sync_timeout_s = sync_timeout_s
        self.transfer_backend = transfer_backend
        self.world_size = world_size
        self.sleep_mode = sleep_mode
        self.name = name
        self.gpus = gpus
        self.weight_version = 0
        self._request_ids = itertools.count()
        self._num_in_flight = 0
        self._lock = threading.Lock()
        self._sync: Any = None
        self._received: set[str] | None = None
        self.adapters: Any = None
        """``VLLMAdapters`` of a LoRA engine (``from_pretrained(lora=...)``), else None."""

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: Literal["float32", "bfloat16"] = "float32",
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        sync_timeout_s: float = 300.0,
        start_timeout_s: float = 600.0,
        weight_transport: str = "auto",
        sleep_mode: bool = False,
        gpus: list[int] | None = None,
        name: str = "vLLM engine",
        lora: Any = None,
        max_adapter_versions: int = 2,
        **engine_kwargs: Any,
    ) -> VLLMEngine:
        """Start vLLM on a local Hugging Face folder (nothing is downloaded).

        ``gpu_memory_utilization`` is a fraction of GPU memory (of host memory on the CPU
        build); ``kv_cache_memory_bytes`` sizes the KV cache directly instead (CPU tests).
        ``weight_transport``: "auto" (NCCL on GPUs, gloo on CPU), "nccl", "ipc" (a replica
        on the trainer's own GPUs), "gloo", "files";
        ``sleep_mode``: enable vLLM's sleep mode (colocated with training; GPU only);
        ``gpus``: the GPUs (as this process numbers them) vLLM's processes get;
        ``lora`` (a LoRAConfig): serve LoRA adapters on the frozen base, up to
        ``max_adapter_versions`` at once, synced adapter-only (``agentrl.engines.vllm_lora``).
        ``engine_kwargs`` go to ``vllm.AsyncEngineArgs``."""
        from agentrl.engines.vllm_sync import (
            can_sleep,
            engine_env,
            physical_gpus,
            transfer_backend,
        )

        path = Path(path)
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"VLLMEngine dtype {dtype!r}: use 'float32' or 'bfloat16'")
        expected, tied = read_checkpoint_shapes(path)
        if lora is not None:
            from agentrl.engines.vllm_lora import lora_engine_args
            from agentrl.model import read_args
            from agentrl.model.lora import adapter_shapes

            expected = adapter_shapes(read_args(path), lora)
            engine_kwargs = {**lora_engine_args(lora, max_adapter_versions), **engine_kwargs}
        vllm = _import_vllm()
        backend = transfer_backend(weight_transport)
        sleep_mode = sleep_mode and can_sleep()
        args = vllm.AsyncEngineArgs(
            model=str(path),
            dtype=dtype,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            # sampling comes only from our SamplingParams, not generation_config.json
            generation_config="vllm",
            worker_extension_cls=EXTENSION_QUALNAME,
            weight_transfer_config={"backend": backend} if backend else None,
            enable_sleep_mode=sleep_mode,
            **engine_kwargs,
        )
        world_size = args.tensor_parallel_size * args.pipeline_parallel_size
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="vllm-engine-loop", daemon=True)
        thread.start()

        async def start() -> Any:
            from vllm.v1.engine.async_llm import AsyncLLM

            return AsyncLLM.from_engine_args(args)

        try:
            # vLLM's processes inherit the environment; CUDA IPC handles arrive pickled
            with engine_env(CUDA_VISIBLE_DEVICES=physical_gpus(gpus) if gpus else None,
                            VLLM_ALLOW_INSECURE_SERIALIZATION="1" if backend == "agentrl_ipc"
                            else None):
                llm = asyncio.run_coroutine_threadsafe(start(), loop).result(start_timeout_s)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        engine = cls(llm, loop, thread, expected, tied, sync_timeout_s, backend, world_size,
                     sleep_mode, name, gpus)
        if lora is not None:
            from agentrl.engines.vllm_lora import VLLMAdapters

            engine.adapters = VLLMAdapters(engine, lora, expected, str(path))
        return engine

    @property
    def keeps_adapter_versions(self) -> bool:
        """True for a LoRA engine: a sync adds an adapter version beside the ones running
        requests use, so it may come while they run."""
        return self.adapters is not None

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       key: str | None = None) -> Generation:
        """Complete one prompt; concurrent calls are batched by vLLM's scheduler (its
        prefix cache serves a rollout's growing context, whatever ``key``)."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; give at least one token id")
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens is {params.max_tokens}; need >= 1")
        request_id = f"agentrl-{next(self._request_ids)}"
        version, lora_request = (self.adapters.acquire() if self.adapters is not None
                                 else (None, None))
        with self._lock:
            self._num_in_flight += 1
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._generate(list(prompt_ids), params, request_id, lora_request), self._loop
            )
            # cancelling the awaiting caller cancels the vLLM request (which aborts it)
            generation = await asyncio.wrap_future(future)
        finally:
            with self._lock:
                self._num_in_flight -= 1
            if self.adapters is not None:
                self.adapters.release(version)
        if version is not None:  # every token came from the adapter the request started on
            generation.versions = [version] * len(generation.token_ids)
        return generation

    def served_version(self) -> int:
        """The weight version vLLM itself reports (its "default" before any sync counts
        as 0): what ``weight_version`` must agree with."""
        version = str(self._call(self._llm.get_weight_version(), "get_weight_version"))
        return int(version) if version.lstrip("-").isdigit() else 0

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode: free the KV cache (and offload or drop the weights, level 1
        or 2). A no-op where vLLM has no sleep mode (the CPU build)."""
        if self.sleep_mode:
            self._call(self._llm.sleep(level), "sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the memory back ("weights", "kv_cache"; None: all)."""
        if self.sleep_mode:
            self._call(self._llm.wake_up(tags), "wake_up")

    def shutdown(self) -> None:
        """Stop vLLM's processes and the engine's loop thread."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        if self._sync is not None and hasattr(self._sync, "close"):
            self._sync.close()
        if self.adapters is not None:
            self.adapters.close()

        async def stop() -> None:  # on the engine's loop, where vLLM's tasks live
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again at interpreter exit, when its module
            # globals are already gone, and prints a TypeError: it is done, make that a no-op
            llm.shutdown = lambda *args, **kwargs: None

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str,
        lora_request: Any = None,
    ) -> Generation:
        from vllm.inputs import TokensPrompt

        final = None
        stream = self._llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), to_vllm_params(params), request_id,
            lora_request=lora_request,
        )
        async for output in stream:
            final = output
        assert final is not None and final.finished, "vLLM ended a request without output"
        return from_vllm_output(final.outputs[0])

    def _call(self, coro: Any, what: str) -> Any:
        """Run a coroutine on vLLM's loop, bounded by ``sync_timeout_s``."""
        # No timeout inside vLLM: a timed-out call there leaves a stale reply in its worker
        # queue that a later call would read; calls queue in order behind an abandoned one.
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=self.sync_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise WeightSyncError(
                f"vLLM did not confirm {what} within {self.sync_timeout_s} s; its weights "
                "are now undefined: restart it (or raise sync_timeout_s)"
            ) from None

    def _call_soon(self, coro: Any) -> None:
        """Schedule a coroutine on vLLM's loop without waiting for it (dropping an unused
        adapter must not hold up the request that released it)."""
        if self._llm is not None:
            asyncio.run_coroutine_threadsafe(_quietly(coro), self._loop)
        else:
            coro.close()

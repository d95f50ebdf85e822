"""FSDP2 sharding of the policy: fp32 master weights and optimizer state, sharded over the
ranks, low-precision compute, fp32 gradient reduction.

``fully_shard`` wraps every decoder layer and then the root (embeddings, final norm and
LM head; a tied head shares the embedding's shard). Each rank keeps 1/N of the fp32
parameters, gradients and AdamW state; a layer's parameters are all-gathered in the
compute dtype just before it runs and freed after (and gathered again for backward).
The root of a model being trained stays gathered from its forward to its backward, which
needs it first thing (one all-gather per micro-batch saved; FSDP2's own default for the
root, which an explicit ``reshard_after_forward=True`` would override). Gradients are
reduce-scattered in fp32 and SUMMED (divide factor 1): the loss already divides by the
whole update's token count over all ranks, so a sum gives each token its 1/N weight
whatever the rank count. With ``train.gradient_sync = "update"`` they are reduce-scattered
once per update (:func:`set_gradient_sync`): the micro-batches before the last
accumulate unsharded fp32 gradients, which the memory plan counts. One rank computing in
its parameters' dtype, or one CPU rank in mixed precision, is not wrapped at all
(:func:`shards`).

Loading never materialises the model on every rank: ranks build it on the meta device,
shard it, and rank 0 alone reads the Hugging Face checkpoint and broadcasts each tensor
(``broadcast_from_rank0``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from agentrl.parallel.cast import compute_in
from agentrl.parallel.groups import broadcast_object, get_rank, get_world_size


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """``model.dtype`` as a torch dtype; "auto" is bfloat16 on a GPU, float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def shard_model(model: nn.Module, compute: torch.dtype | None, device: torch.device,
                trained: bool = True) -> nn.Module:
    """``fully_shard`` each decoder layer and the root over all ranks, in place.

    ``compute`` (dtype) None computes in the parameters' own dtype. Gradients reduce in
    fp32 and sum over ranks. ``trained``: the root keeps its gathered parameters from
    forward to backward; a frozen model (the KL reference, forward only) frees them after
    each forward instead, as it has no backward to free them.
    """
    mesh = init_device_mesh(device.type, (get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=not trained)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum, never average, over ranks
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL)
    return model


def shards(num_ranks: int, mixed_precision: bool, on_cpu: bool = False) -> bool:
    """Whether the trainer wraps its model in FSDP2: over several ranks, or to compute in
    another dtype than the stored one on a GPU (FSDP2's mixed-precision casts). One rank
    computing in its parameters' own dtype keeps the model plain: FSDP2 would have no
    one to share with and still copy every layer's parameters in at each forward and
    backward, and every gradient out (8 % of an 8-layer CPU update, 65 MB). One CPU rank
    in mixed precision stays plain too and casts in each module's forward instead
    (:mod:`agentrl.parallel.cast`)."""
    return num_ranks > 1 or (mixed_precision and not on_cpu)


def lay_out(model: nn.Module, compute: torch.dtype, mixed: bool, device: torch.device,
            trained: bool = True) -> None:
    """Lay a model built on the meta device out as the trainer holds it, before its
    storage exists: FSDP2 where :func:`shards` says so (computing in ``compute`` when
    ``mixed``), else plain, casting in each module's forward when ``mixed``."""
    if shards(get_world_size(), mixed, on_cpu=device.type == "cpu"):
        shard_model(model, compute if mixed else None, device, trained)
    elif mixed:
        compute_in(model, compute)


def load_sharded(path: str | Path, state: dict[str, torch.Tensor], param_dtype: torch.dtype,
                 compute: torch.dtype, attention: str, device: torch.device,
                 trained: bool = True,
                 prepare: Callable[[nn.Module], object] | None = None) -> nn.Module:
    """The CausalLM of a Hugging Face folder, sharded over all ranks on ``device``
    (collective; plain where :func:`shards` says so). ``state`` holds the whole checked
    state dict on rank 0 (read it there first, e.g. with ``groups.run_on_main``) and
    nothing on the other ranks, which need no copy of the folder but its config.

    Parameters are stored in ``param_dtype`` (fp32 master weights for the policy; the
    compute dtype for a frozen reference, ``trained`` False) and computed in ``compute``.
    ``prepare`` changes the model before it is sharded (LoRA adds its fp32 adapters and
    freezes the base): each tensor of ``state`` is then stored in its parameter's own dtype.
    """
    from agentrl.model import CausalLM, read_args
    from agentrl.model.checkpoint import fresh_inv_freq

    args = broadcast_object(read_args(Path(path)) if get_rank() == 0 else None)
    with torch.device("meta"):
        model = CausalLM(args, attention=attention)
    model = model.to(param_dtype)
    if prepare is not None:
        prepare(model)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    mixed = any(dtype != compute for dtype in dtypes.values())
    lay_out(model, compute, mixed, device, trained)
    model.to_empty(device=device)
    if args.tie_word_embeddings:  # to_empty gives the head a tensor of its own: re-tie
        model.lm_head.weight = model.model.embed_tokens.weight
    state = {k: v.to(dtypes.get(k, param_dtype)) for k, v in state.items()}
    set_model_state_dict(model, state, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, strict=False))
    model.inv_freq = fresh_inv_freq(args).to(device)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (collective; empty on other ranks)."""
    return get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


def iter_full_parameters(model: nn.Module, dtype: torch.dtype | None = None,
                         select: Callable[[str], bool] | None = None
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, whole tensor) for each parameter, gathered ONE at a time (collective: every
    rank must iterate to the end). A tied head is yielded once, under the embedding's name.
    ``select``: only the parameters whose name it accepts are gathered (LoRA: adapters).
    """
    for name, param in model.named_parameters():
        if select is not None and not select(name):
            continue
        tensor = param.detach() if dtype is None else param.detach().to(dtype)  # cast the
        if isinstance(tensor, DTensor):  # shard first: the gather moves dtype-sized bytes
            tensor = tensor.full_tensor()
        yield name, tensor


def local_bytes(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)."""
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)]


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over every rank's shards) to ``max_norm``; returns the
    norm before clipping. ``max_norm`` 0 or less only measures it."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):  # a partial norm of each rank's shard: reduce it
        norm = norm.full_tensor()
    if max_norm > 0:
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return float(norm)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Whether the next backward reduce-scatters the gradients over the ranks (FSDP2's
    ``set_requires_gradient_sync``); off, each rank accumulates unsharded fp32 gradients
    locally until a backward with it on. No-op for a model that is not sharded."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


def is_sharded(model: nn.Module) -> bool:
    """True when ``model`` went through :func:`shard_model`."""
    return isinstance(model, FSDPModule)


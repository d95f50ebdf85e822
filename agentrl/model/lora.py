"""Low-rank adapters (LoRA) on the native decoder, written in our own model code.

An adapted projection computes ``W x + b + (alpha / r) · B (A dropout(x))`` with the base
``W``, ``b`` frozen and only ``A`` [r, in] and ``B`` [out, r] trained (Hu et al.; the same
formula and initialization as PEFT: A Kaiming-uniform, B zero, so a fresh adapter leaves
every log-prob exactly the base model's). :class:`LoRALinear` keeps the base
parameters under their Hugging Face names and adds ``lora_A.weight`` / ``lora_B.weight``
beside them, so ``model.layers.0.self_attn.q_proj.lora_A.weight`` is PEFT's key without
its ``base_model.model.`` prefix (``agentrl.model.peft_format``) and FSDP2 shards the
adapters inside their decoder layer's unit like any other parameter.

Why not PEFT itself: PEFT swaps modules for wrappers that rename the base parameters
(``q_proj.base_layer.weight``), which would break the one-to-one HF names our checkpoint
loader, FSDP2 state dicts and weight syncs rely on, and it adds transformers and
accelerate to every install. The adapter is twenty lines here; PEFT's package is used
where it is the reference: tests load our checkpoints with ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.config.train_settings import LoRAConfig
from agentrl.model.args import ModelArgs

ADAPTER_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
NOT_ADAPTABLE = ("embed_tokens", "lm_head")
"""Modules that never get an adapter: the embedding is no linear layer, and the LM head
computes log-probs from its weight directly (``agentrl.model.logprobs``)."""


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int,
                 alpha: float, dropout: float = 0.0) -> None:
        """``rank``, ``alpha``, ``dropout``: LoRAConfig's. The adapter is created in fp32
        (its master weights), the base in whatever the caller assigns."""
        super().__init__(in_features, out_features, bias=bias)
        self.lora_A = nn.Linear(in_features, rank, bias=False, dtype=torch.float32)
        self.lora_B = nn.Linear(rank, out_features, bias=False, dtype=torch.float32)
        self.scaling = alpha / rank
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Base output plus the scaled adapter output; dropout only in training forwards."""
        out = F.linear(x, self.weight, self.bias)
        if self.dropout > 0 and self.training and torch.is_grad_enabled():
            x = F.dropout(x, self.dropout, training=True)
        return out + self.lora_B(self.lora_A(x)) * self.scaling


def matches(name: str, targets: list[str] | str) -> bool:
    """PEFT's rule: a string is a regular expression the whole name must match; a list
    holds names a module's qualified name equals or ends in ("." + name)."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def target_names(model: nn.Module, lora: LoRAConfig) -> list[str]:
    """Qualified names of the linear layers ``lora.target_modules`` selects; ValueError
    when it selects nothing, or a module that cannot take an adapter."""
    chosen = [name for name, _ in model.named_modules() if name and matches(
        name, lora.target_modules)]
    wrong = [n for n in chosen if n.split(".")[-1] in NOT_ADAPTABLE or not isinstance(
        model.get_submodule(n), nn.Linear)]
    if wrong:
        raise ValueError(f"model.lora.target_modules selects {wrong[:3]}, which cannot take "
                         "an adapter (only the decoder's linear projections can); name "
                         "projections such as q_proj or down_proj")
    if not chosen:
        raise ValueError(f"model.lora.target_modules = {lora.target_modules!r} selects no "
                         "module of this model; use projection names such as q_proj, "
                         "v_proj, down_proj")
    return chosen


def add_adapters(model: nn.Module, lora: LoRAConfig) -> list[str]:
    """Replace every targeted projection by a :class:`LoRALinear` holding the same base
    parameters, freeze everything else, and return the targeted names. The new adapter
    tensors are uninitialized on a real device (fill them with
    :func:`initial_adapter_state` or a checkpoint) and meta on the meta device."""
    names = target_names(model, lora)
    model.requires_grad_(False)
    for name in names:
        old = model.get_submodule(name)
        parent_name, _, child = name.rpartition(".")
        with torch.device("meta"):  # the base tensors are the old ones: allocate none
            new = LoRALinear(old.in_features, old.out_features, old.bias is not None,
                             lora.rank, lora.alpha, lora.dropout)
        new.weight, new.bias = old.weight, old.bias
        for part in (new.lora_A, new.lora_B):
            part.to_empty(device=old.weight.device)
        new.weight.requires_grad_(False)
        if new.bias is not None:
            new.bias.requires_grad_(False)
        setattr(model.get_submodule(parent_name), child, new)
    return names


def is_adapter(name: str) -> bool:
    """Whether a parameter name is an adapter's (``...lora_A.weight`` / ``lora_B``)."""
    return name.endswith(ADAPTER_SUFFIXES)


def adapter_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(name, parameter) of every adapter tensor, in the model's order."""
    return ((n, p) for n, p in model.named_parameters() if is_adapter(n))


def projection_shapes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear projection of a model of ``args``, by qualified name, in
    the model's order (no model built: the plan asks often)."""
    h, i = args.hidden_size, args.intermediate_size
    hq = args.num_attention_heads * args.head_dim
    hkv = args.num_key_value_heads * args.head_dim
    per_layer = {"self_attn.q_proj": (h, hq), "self_attn.k_proj": (h, hkv),
                 "self_attn.v_proj": (h, hkv), "self_attn.o_proj": (hq, h),
                 "mlp.gate_proj": (h, i), "mlp.up_proj": (h, i), "mlp.down_proj": (i, h)}
    return {f"model.layers.{n}.{name}": shape for n in range(args.num_hidden_layers)
            for name, shape in per_layer.items()}


def adapter_shapes(args: ModelArgs, lora: LoRAConfig) -> dict[str, tuple[int, ...]]:
    """Name and shape of every adapter tensor of a model of ``args``: A [r, in] and
    B [out, r] of each projection ``lora`` targets (no weights built)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, (fan_in, fan_out) in projection_shapes(args).items():
        if matches(name, lora.target_modules):
            shapes[f"{name}.lora_A.weight"] = (lora.rank, fan_in)
            shapes[f"{name}.lora_B.weight"] = (fan_out, lora.rank)
    return shapes


def initial_adapter_state(args: ModelArgs, lora: LoRAConfig,
                          seed: int) -> dict[str, torch.Tensor]:
    """Fresh fp32 adapters, as PEFT initializes them: A Kaiming-uniform (a = sqrt 5, i.e.
    U(±1/sqrt(in))), B zero; drawn from their own generator seeded by ``seed`` (the
    global RNG is left alone)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in adapter_shapes(args, lora).items():
        if name.endswith(".lora_B.weight"):
            state[name] = torch.zeros(shape)
        else:
            bound = 1.0 / math.sqrt(shape[1])
            state[name] = torch.rand(shape, generator=generator) * (2 * bound) - bound
    return state


def merged_weights(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor],
                   lora: LoRAConfig) -> dict[str, torch.Tensor]:
    """The base state dict with every adapter folded in: W + (alpha / r) · B @ A, in fp32
    and cast back to W's dtype; the result is a plain model of the base's shape."""
    merged = dict(base)
    scaling = lora.alpha / lora.rank
    for name in adapters:
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        weight = base[f"{module}.weight"]
        delta = adapters[f"{module}.lora_B.weight"].float() @ adapters[name].float()
        merged[f"{module}.weight"] = (weight.float() + scaling * delta).to(weight.dtype)
    return merged


def count_adapter_parameters(args: ModelArgs, lora: LoRAConfig) -> int:
    """Adapter values of a model of ``args``: r · (in + out) per adapted projection."""
    return sum(math.prod(shape) for shape in adapter_shapes(args, lora).values())


def describe_adapters(model: nn.Module, lora: LoRAConfig, base_dtype: str) -> str:
    """One line for the run's start: what is trained and what is frozen."""
    adapted = sum(isinstance(m, LoRALinear) for m in model.modules())
    trained = sum(p.numel() for _, p in adapter_parameters(model))
    total = sum(p.numel() for p in model.parameters())
    return (f"LoRA: rank {lora.rank}, alpha {lora.alpha:g} on {adapted} projections: "
            f"{trained:,} trained parameters ({100 * trained / total:.2f}% of {total:,}); "
            f"the base is frozen in {base_dtype} (no gradients, no AdamW state)")

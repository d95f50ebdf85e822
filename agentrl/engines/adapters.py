"""LoRA adapters in the built-in engine, one set per policy version, several live at once.

A LoRA run syncs only adapter tensors (``...q_proj.lora_A.weight`` / ``lora_B``). The
engine's model stays the plain frozen base; :class:`AdapterVersions` adds each adapted
projection's low-rank update with a forward hook, ``(alpha / r) · B_v (A_v x)``, where
``v`` is the version the row's request runs under. A request takes the newest version
when it is admitted and keeps it to its end (a new turn of the same rollout is a new
request: it takes the newest), so a sync never waits for running requests and every
token records the version that made it. Versions that no running request uses any more
are dropped; with ``rollout.max_staleness = k`` at most k + 1 are live in a correct run.

Rows of one forward may run under different versions: each live version's update is
computed over all rows and kept where the row's version is that one, so a row's result
does not depend on which versions its neighbours run (batch invariance). With no version
installed (before the first sync) the hooks add nothing: the base, which is exactly what
a fresh adapter (B = 0) computes. A request admitted then keeps that base to its end, also
when a sync installs the first version while it runs.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.config.train_settings import LoRAConfig
from agentrl.engines.interface import WeightSyncError
from agentrl.model.lora import target_names

Adapter = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""Module name → (A [r, in], B [out, r]) of one version."""


class AdapterVersions:
    """The adapter versions one engine's model serves (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, lora: LoRAConfig, name: str = "engine",
                 move_running: bool = False) -> None:
        """Hook every projection ``lora`` targets in ``model``. ``move_running``
        (rollout.inflight_updates): a sync moves running requests to the new version at
        their next decode step instead of letting them finish on theirs."""
        self.lora = lora
        self.scaling = lora.alpha / lora.rank
        self.name = name
        self.move_running = move_running
        self.modules = {n: model.get_submodule(n) for n in target_names(model, lora)}
        self.shapes = {}
        for module_name, module in self.modules.items():
            self.shapes[f"{module_name}.lora_A.weight"] = (lora.rank, module.in_features)
            self.shapes[f"{module_name}.lora_B.weight"] = (module.out_features, lora.rank)
        self.live: dict[int, Adapter] = {}
        """Installed versions, oldest first."""
        self.newest: int | None = None
        self.first: int | None = None
        """The first version installed; requests of older versions run on the base."""
        self._receiving: dict[str, torch.Tensor] | None = None
        self._rows: list[int] | None = None
        self._hooks = [module.register_forward_hook(self._hook(module_name))
                       for module_name, module in self.modules.items()]

    # ------------------------------------------------------------------ sync session

    def start(self) -> None:
        """Begin receiving a version (running requests go on meanwhile)."""
        self._receiving = {}

    def load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Take one bucket of adapter tensors; ValueError on a name or shape this engine's
        adapters do not have (a full-weight sync to a LoRA engine, another rank)."""
        if self._receiving is None:
            raise WeightSyncError(f"{self.name}: load_bucket outside a weight update")
        for tensor_name, tensor in bucket:
            want = self.shapes.get(tensor_name)
            if want != tuple(tensor.shape):
                got = tuple(tensor.shape)
                raise ValueError(f"{self.name}: tensor {tensor_name} {got} is not one of this "
                                 f"engine's LoRA adapters ({want or 'no such adapter'}); a "
                                 "LoRA run sends adapter tensors only, of the configured "
                                 "rank and target_modules")
            device, dtype = self._device_dtype(tensor_name)
            self._receiving[tensor_name] = tensor.detach().to(device=device, dtype=dtype,
                                                              copy=True)

    def finish(self, version: int, in_use: set[int]) -> None:
        """Install the received tensors as ``version`` (every adapter must have arrived)
        and drop the versions neither newest nor in ``in_use``."""
        received, self._receiving = self._receiving, None
        received = complete_update(received, self.shapes.keys(), self.name)
        self.live[version] = {
            m: (received[f"{m}.lora_A.weight"], received[f"{m}.lora_B.weight"])
            for m in self.modules}
        self.newest = version
        self.first = version if self.first is None else self.first
        self.keep(in_use)

    def keep(self, in_use: set[int]) -> None:
        """Drop every version but the newest and those running requests use."""
        for version in unused_versions(self.live, self.newest, in_use):
            del self.live[version]

    # ------------------------------------------------------------------ forwards

    @contextmanager
    def selected(self, versions: list[int]) -> Iterator[None]:
        """Run the forward inside under ``versions[i]`` for row i."""
        self._rows = versions
        try:
            yield
        finally:
            self._rows = None

    def _hook(self, module_name: str) -> Any:
        def add_update(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                       output: torch.Tensor) -> torch.Tensor:
            rows = self._rows
            if rows is None or not self.live:
                return output
            x = inputs[0]
            distinct = sorted(set(rows))
            for version in (v for v in distinct if self._adapted(v)):
                a, b = self.live[version][module_name]
                updated = output + F.linear(F.linear(x, a), b) * self.scaling
                if len(distinct) == 1:  # every row runs under this version
                    return updated
                mine = torch.tensor([v == version for v in rows], device=output.device)
                output = torch.where(mine.view(-1, *[1] * (output.dim() - 1)), updated, output)
            return output

        return add_update

    def _adapted(self, version: int) -> bool:
        """Whether rows of ``version`` get an adapter's update: False for a version from
        before the first sync (the base); an error for a dropped one still running."""
        if version in self.live:
            return True
        if self.first is None or version < self.first:
            return False
        raise WeightSyncError(f"{self.name}: adapter version {version} was dropped while a "
                              f"request still runs on it (live: {sorted(self.live)})")

    def _device_dtype(self, tensor_name: str) -> tuple[torch.device, torch.dtype]:
        module_name = tensor_name.rsplit(".", 2)[0]
        weight = self.modules[module_name].weight
        return weight.device, weight.dtype


def unused_versions(live: Iterable[int], newest: int | None,
                    in_use: Container[int]) -> list[int]:
    """The adapter versions an engine drops: every live one but the newest and those
    running requests use (the one rule of the built-in engine and of vLLM)."""
    return [v for v in live if v != newest and v not in in_use]


def complete_update(received: dict[str, torch.Tensor] | None, expected: Iterable[str],
                    engine_name: str) -> dict[str, torch.Tensor]:
    """The tensors of a finished adapter update, checked: an update was started and every
    expected adapter tensor arrived (an adapter is only usable whole)."""
    if received is None:
        raise WeightSyncError(f"{engine_name}: finish without a started weight update")
    missing = sorted(set(expected) - received.keys())
    if missing:
        raise ValueError(f"{engine_name}: the adapter update lacks {len(missing)} tensors, "
                         f"e.g. {missing[:3]}; send every adapter tensor")
    return received

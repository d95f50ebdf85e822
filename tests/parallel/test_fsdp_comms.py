"""What FSDP2 sends per update, measured on 2 gloo ranks: one reduce-scatter of the
gradients per update (not per micro-batch) and no all-gather of the root for backward.

Every all-gather and reduce-scatter FSDP2 issues goes through
``torch.distributed.all_gather_single`` / ``reduce_scatter_single``; the workers count
the calls and the bytes each rank puts in, for the trainer's settings and for the
settings before issue 24 (root resharded after forward, gradients reduced after every
micro-batch), on the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from agentrl.parallel.fsdp import shard_model
from agentrl.train.update import forward_backward
from tests.parallel.ranks import spawn_ranks
from tests.test_update import ARGS, CFG, make_model, make_rows, micro_batches_for

NUM_RANKS = 2
NUM_MICRO_BATCHES = 4
NUM_UNITS = ARGS.num_hidden_layers + 1
"""FSDP2 units: every decoder layer and the root (embeddings, final norm, head)."""


class Traffic:
    """Calls and input bytes of FSDP2's collectives on this rank."""

    def __init__(self) -> None:
        self.calls = {"all_gather": 0, "reduce_scatter": 0}
        self.bytes = {"all_gather": 0, "reduce_scatter": 0}
        self._originals = (dist.all_gather_single, dist.reduce_scatter_single)

    def __enter__(self) -> Traffic:
        gather, scatter = self._originals

        def counted(kind, fn, tensor):
            self.calls[kind] += 1
            self.bytes[kind] += tensor.numel() * tensor.element_size()
            return fn

        dist.all_gather_single = lambda out, inp, **kw: counted(
            "all_gather", gather, inp)(out, inp, **kw)
        dist.reduce_scatter_single = lambda output, input, **kw: counted(
            "reduce_scatter", scatter, input)(output=output, input=input, **kw)
        return self

    def __exit__(self, *exc: object) -> None:
        dist.all_gather_single, dist.reduce_scatter_single = self._originals


def one_update(rank: int, settings: str) -> tuple[Traffic, torch.Tensor]:
    model = shard_model(make_model(seed=0), None, torch.device("cpu"))
    if settings == "before":
        model.set_reshard_after_forward(True, recurse=False)  # the root, as it was
    rows, advantages = make_rows(num_rows=2 * NUM_RANKS * NUM_MICRO_BATCHES, seed=1)
    mine = [[2 * (NUM_RANKS * i + rank), 2 * (NUM_RANKS * i + rank) + 1]
            for i in range(NUM_MICRO_BATCHES)]
    mbs = micro_batches_for(rows, advantages, mine)
    forward_backward(model, mbs[:1], CFG)  # lazy initialisation out of the count
    model.zero_grad(set_to_none=True)
    with Traffic() as traffic:
        forward_backward(model, mbs, CFG,
                         gradient_sync="micro_batch" if settings == "before" else "update")
    grads = torch.cat([p.grad.full_tensor().reshape(-1) for p in model.parameters()])
    return traffic, grads


def _worker(rank: int, out_dir: str) -> None:
    result = {}
    for settings in ("before", "now"):
        traffic, grads = one_update(rank, settings)
        result[settings] = {"calls": traffic.calls, "bytes": traffic.bytes}
        torch.save(grads, Path(out_dir) / f"{settings}{rank}.pt")
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


def test_one_reduce_scatter_per_update_and_the_root_kept_for_backward(tmp_path: Path) -> None:
    spawn_ranks(NUM_RANKS, _worker, str(tmp_path))
    for rank in range(NUM_RANKS):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        before, now = result["before"], result["now"]
        # gradients: every unit reduce-scattered once per update, not once per micro-batch
        assert before["calls"]["reduce_scatter"] == NUM_UNITS * NUM_MICRO_BATCHES
        assert now["calls"]["reduce_scatter"] == NUM_UNITS
        assert now["bytes"]["reduce_scatter"] * NUM_MICRO_BATCHES == (
            before["bytes"]["reduce_scatter"])
        # parameters: every unit for forward, the layers again for backward, the root once
        assert before["calls"]["all_gather"] == 2 * NUM_UNITS * NUM_MICRO_BATCHES
        assert now["calls"]["all_gather"] == (2 * NUM_UNITS - 1) * NUM_MICRO_BATCHES
        assert now["bytes"]["all_gather"] < before["bytes"]["all_gather"]
        # and the same gradient
        assert torch.allclose(torch.load(tmp_path / f"now{rank}.pt"),
                              torch.load(tmp_path / f"before{rank}.pt"), atol=1e-6, rtol=0)

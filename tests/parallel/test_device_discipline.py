"""Every trainer op runs on the model's device; attention says which path it took.

A CPU-only machine has no second real device, so these use PyTorch's ``meta`` device as
the model's: any op that mixes it with a CPU tensor raises, as a GPU op mixing in a CPU
tensor does.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from agentrl.model.attention import choose_backend
from agentrl.parallel.fsdp import compute_dtype
from agentrl.train.trainer import mismatch_sums
from tests.test_update import make_rows, micro_batches_for

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_engine_logprob_mismatch_is_computed_on_the_scores_device() -> None:
    rows, advantages = make_rows(num_rows=4)
    mbs = micro_batches_for(rows, advantages, [[0, 1], [2, 3]])
    assert all(mb.engine_logprobs.device.type == "cpu" for mb in mbs)
    on_cpu = mismatch_sums(mbs, [torch.zeros_like(mb.engine_logprobs) for mb in mbs])
    # scores of zero: the mismatch is Σ|engine log-prob| over the generated tokens
    expected = sum(float((mb.engine_logprobs.abs() * mb.loss_mask).sum()) for mb in mbs)
    assert on_cpu.tolist() == pytest.approx([expected, sum(mb.num_tokens for mb in mbs)])
    scored = [torch.zeros_like(mb.engine_logprobs, device="meta") for mb in mbs]
    sums = mismatch_sums(mbs, scored)  # subtracting CPU log-probs here raised before
    assert sums.device.type == "meta" and sums.shape == (2,)


@pytest.mark.parametrize(("choice", "dtype", "device", "installed", "backend", "reason"), [
    ("auto", torch.bfloat16, CUDA, False, "varlen", "torch varlen_attn (bfloat16)"),
    ("auto", torch.bfloat16, CUDA, True, "varlen", "torch varlen_attn (bfloat16)"),
    ("flash", torch.bfloat16, CUDA, True, "flash", "flash-attn varlen (bfloat16)"),
    ("varlen", torch.float16, CUDA, False, "varlen", "torch varlen_attn (float16)"),
    ("auto", torch.float32, CUDA, True, "torch", "compute dtype is float32"),
    ("auto", torch.bfloat16, CPU, True, "torch", "runs on cpu"),
    ("torch", torch.bfloat16, CUDA, True, "torch", 'model.attention = "torch"'),
])
def test_attention_takes_torch_varlen_on_a_gpu_without_building_anything(
        choice, dtype, device, installed, backend, reason) -> None:
    chosen, why = choose_backend(choice, dtype, device, flash_available=installed,
                                 capability=(9, 0))
    assert chosen == backend and reason in why


def test_an_old_gpu_takes_the_per_row_path_and_says_why() -> None:
    chosen, why = choose_backend("auto", torch.bfloat16, CUDA, capability=(7, 5))
    assert chosen == "torch" and "compute capability is 7.5" in why


def test_asking_for_a_kernel_where_it_cannot_run_is_an_error() -> None:
    with pytest.raises(ValueError, match="kernels need bfloat16"):
        choose_backend("flash", torch.float32, CUDA, flash_available=True, capability=(9, 0))
    with pytest.raises(ValueError, match=r"pip install agentrl\[flash\] --no-build-isolation"):
        choose_backend("flash", torch.bfloat16, CUDA, flash_available=False, capability=(9, 0))
    with pytest.raises(ValueError, match="need a GPU"):
        choose_backend("varlen", torch.bfloat16, CPU)


def test_auto_compute_dtype_is_bf16_on_a_gpu_and_fp32_on_the_cpu() -> None:
    assert compute_dtype("auto", CUDA) == torch.bfloat16
    assert compute_dtype("auto", CPU) == torch.float32
    assert compute_dtype("bfloat16", CPU) == torch.bfloat16


def test_the_training_device_follows_local_rank(monkeypatch) -> None:
    from agentrl.parallel import groups

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("RANK", "11")  # rank 11 of a second machine: still its GPU 3
    assert groups.local_device() == torch.device("cuda", 3)


# ----------------------------------------------------------------- host-device syncs


class DeviceSyncCounter(TorchFunctionMode):
    """Counts what makes a host wait for a GPU, with ``meta`` standing in for the GPU:
    reading a device tensor's values back (``tolist``, ``item``, ``bool``, ``nonzero``,
    ``cpu``...) and host-to-device copies. A read returns a stand-in value (meta tensors
    have none), so the code runs on and every read is counted where it happens."""

    READS = {Tensor.tolist: "tolist", Tensor.item: "item", Tensor.__bool__: "bool",
             Tensor.__int__: "int", Tensor.__float__: "float", Tensor.__index__: "index",
             Tensor.nonzero: "nonzero", torch.nonzero: "nonzero", Tensor.cpu: "cpu",
             Tensor.numpy: "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.copies = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args and isinstance(args[0], Tensor) else None
        if func in self.READS and tensor is not None and tensor.is_meta:
            self.reads.append(self.READS[func])
            return self._stand_in(func, tensor)
        if func in (Tensor.to, Tensor.cuda) and tensor is not None and not tensor.is_meta:
            with torch._C.DisableTorchFunction():
                moved = func(*args, **kwargs)
            self.copies += moved.is_meta
            return moved
        return func(*args, **kwargs)

    @staticmethod
    def _stand_in(func, tensor: Tensor):
        if func in (Tensor.tolist,):
            return torch.zeros(tensor.shape).tolist()
        if func in (Tensor.nonzero, torch.nonzero, Tensor.cpu):
            return torch.zeros(0, 1, dtype=torch.int64)
        if func is Tensor.numpy:
            return torch.zeros(tensor.shape).numpy()
        return func(torch.zeros((), dtype=tensor.dtype))


def syncs_of_one_update(num_micro_batches: int, checkpointing: bool) -> tuple[int, int]:
    """(device reads, host-to-device copies) of one forward_backward on the meta device."""
    from agentrl.config import LossConfig
    from agentrl.model import CausalLM
    from agentrl.train.update import forward_backward
    from tests.test_update import make_model

    args = make_model().config
    with torch.device("meta"):
        model = CausalLM(args, attention="torch")
    model.configure_memory(checkpointing, logprob_chunk_tokens=8)
    rows, advantages = make_rows(num_rows=2 * num_micro_batches)
    mbs = micro_batches_for(rows, advantages, [[2 * i, 2 * i + 1]
                                               for i in range(num_micro_batches)])
    counter = DeviceSyncCounter()
    with counter:
        forward_backward(model, mbs, LossConfig(negative_advantage_veto=2.0))
    return len(counter.reads), counter.copies


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_a_micro_batch_costs_one_copy_and_no_device_sync(checkpointing) -> None:
    reads_1, copies_1 = syncs_of_one_update(1, checkpointing)
    reads_4, copies_4 = syncs_of_one_update(4, checkpointing)
    assert reads_4 == reads_1 <= 2  # the update's token count and its figures, once each
    assert copies_4 - copies_1 == 3  # one host-to-device copy per micro-batch


def test_a_weight_sync_takes_its_turn_between_two_micro_batches(monkeypatch) -> None:
    """With asynchronous collection a thread syncs weights over NCCL while the trainer
    trains; the two communicators never run at once: the sync waits for the trainer's
    micro-batch, and the next micro-batch waits for the sync's bucket (first come,
    first served, so neither starves)."""
    import threading
    import time

    from agentrl.config import LossConfig
    from agentrl.parallel import groups
    from agentrl.train import update
    from tests.test_update import make_model

    started: list[float] = []
    first_running = threading.Event()
    real_scores = update.target_scores

    def slow_scores(*args, **kwargs):
        started.append(time.monotonic())
        if len(started) == 1:
            first_running.set()
            time.sleep(0.3)  # the sync asks for its turn meanwhile
        return real_scores(*args, **kwargs)

    sync_turn: list[float] = []

    def weight_sync() -> None:
        first_running.wait(5)
        with groups.one_communicator_at_a_time():
            sync_turn.append(time.monotonic())
            time.sleep(0.2)  # one bucket's broadcast
            sync_turn.append(time.monotonic())

    monkeypatch.setattr(update, "target_scores", slow_scores)
    groups.share_gpu_between_threads(True)
    try:
        rows, advantages = make_rows(num_rows=4)
        thread = threading.Thread(target=weight_sync)
        thread.start()
        update.forward_backward(make_model(), micro_batches_for(rows, advantages,
                                                                [[0, 1], [2, 3]]),
                                LossConfig())
        thread.join(5)
    finally:
        groups.share_gpu_between_threads(False)
    assert len(started) == 2 and len(sync_turn) == 2
    assert started[0] + 0.3 <= sync_turn[0]  # after the first micro-batch's turn
    assert sync_turn[1] <= started[1]  # the second waited for the bucket

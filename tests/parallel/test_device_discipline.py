"""Every trainer op runs on the model's device; attention says which path it took.

A CPU-only machine has no second real device, so these use PyTorch's ``meta`` device as
the model's: any op that mixes it with a CPU tensor raises, as a GPU op mixing in a CPU
tensor does.
"""

from __future__ import annotations

import pytest
import torch

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

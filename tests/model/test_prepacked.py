"""Linear weights packed once for MKL's GEMM (agentrl.model.prepacked): the same products as
F.linear, never used once stale or where a gradient is recorded, and the engine's
generations the same with packing on and off, including after a weight sync."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained
from agentrl.model.prepacked import (
    Linear,
    can_prepack,
    drop_prepacked,
    prepack_linears,
    prepackable,
)

pytestmark = pytest.mark.skipif(not can_prepack(torch.zeros(1)),
                                reason="this torch has no MKL (the packed path cannot run)")


def layer(in_features: int, out_features: int, bias: bool, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    return Linear(in_features, out_features, bias=bias)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), in_features=st.sampled_from([8, 64, 96]),
       out_features=st.sampled_from([16, 48, 128]), bias=st.booleans(),
       lead=st.sampled_from([(), (1,), (2,)]))
def test_a_packed_product_is_f_linear(rows, in_features, out_features, bias, lead):
    module = layer(in_features, out_features, bias)
    assert prepack_linears(module) == 1
    x = torch.randn(*lead, rows, in_features)
    with torch.no_grad():
        got = module(x)
    expected = F.linear(x, module.weight, module.bias)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_prepacked_is_what_runs():
    """The packed copy, not the weight, is what multiplies: overwrite the weight's storage
    behind its version counter and the packed product still gives the old answer."""
    module = layer(64, 32, bias=True)
    x = torch.randn(50, 64)
    before = F.linear(x, module.weight, module.bias)
    prepack_linears(module)
    version = module.weight._version
    module.weight.data.zero_()  # .data: in place, but bypassing the version counter
    assert module.weight._version == version
    with torch.no_grad():
        torch.testing.assert_close(module(x), before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["in place", "new storage"])
def test_a_stale_packed_copy_is_never_used(change):
    module = layer(64, 32, bias=False)
    prepack_linears(module)
    with torch.no_grad():
        if change == "in place":
            module.weight.mul_(2.0)  # an optimizer step, or a sync's copy_
        else:
            module.weight.data = torch.randn(32, 64)
        x = torch.randn(40, 64)
        assert torch.equal(module(x), F.linear(x, module.weight))
    assert prepack_linears(module) == 1  # repacked now, and only once
    assert prepack_linears(module) == 0


def test_a_forward_that_records_a_gradient_uses_the_weight():
    module = layer(32, 16, bias=True)
    prepack_linears(module)
    x = torch.randn(20, 32, requires_grad=True)
    module(x).sum().backward()
    assert module.weight.grad is not None and x.grad is not None
    torch.testing.assert_close(module.weight.grad, x.detach().sum(0).expand(16, 32))


def test_few_rows_and_other_dtypes_take_f_linear():
    module = layer(32, 16, bias=False)
    prepack_linears(module)
    with torch.no_grad():
        for x in (torch.randn(1, 32), torch.randn(3, 32)):
            assert torch.equal(module(x), F.linear(x, module.weight))
    half = layer(32, 16, bias=False).to(torch.bfloat16)
    assert not can_prepack(half.weight) and prepack_linears(half) == 0


@pytest.fixture(scope="module")
def model(tiny_qwen2):
    return load_pretrained(tiny_qwen2, attention="torch").eval()


def generate(model, requests: list, pack: bool, engine: TorchEngine | None = None) -> list:
    engine = engine or TorchEngine(model, max_batch_size=len(requests), max_len=128)
    engine.prepack_weights = pack

    async def together():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in requests))

    return asyncio.run(together())


def assert_same_generations(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                   atol=1e-5, rtol=0)


def test_the_engine_generates_the_same_with_prepackeds(model):
    prompts = [[3 + i, 7, 11 + 2 * i, 5] for i in range(6)]
    requests = [(prompts[i % 6], SamplingParams(temperature=t, max_tokens=12, seed=i))
                for i, t in enumerate([0.0, 1.0] * 6)]
    drop_prepacked(model)
    plain = generate(model, requests, pack=False)
    assert all(m.prepacked is None for m in prepackable(model))
    packed = generate(model, requests, pack=True)
    assert all(m.prepacked is not None for m in prepackable(model))
    assert_same_generations(packed, plain)
    drop_prepacked(model)


def test_after_a_sync_the_engine_generates_with_the_new_weights(tiny_qwen2):
    """A sync copies new weights in place: the engine repacks them and generates exactly
    what a fresh engine on those weights generates; asleep, it holds no packed copy."""
    old = load_pretrained(tiny_qwen2, attention="torch").eval()
    new = load_pretrained(tiny_qwen2, attention="torch").eval()
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    requests = [([4, 9, 2, i], SamplingParams(temperature=0.0, max_tokens=10)) for i in range(5)]
    engine = TorchEngine(old, max_batch_size=5, max_len=128)
    before = generate(old, requests, pack=True, engine=engine)
    engine.update_weights(new.state_dict().items())
    after = generate(old, requests, pack=True, engine=engine)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert_same_generations(after, generate(new, requests, pack=False))
    engine.sleep()
    assert all(m.prepacked is None for m in prepackable(old))


def test_a_copy_leaves_the_packed_weight_behind(model):
    """MKL's packed buffer has no storage to copy: a deep copy (or pickle) of a packed model
    works, holds no packed weight, and computes the same."""
    prepack_linears(model)
    twin = copy.deepcopy(model)
    assert all(m.prepacked is None for m in prepackable(twin))
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    with torch.no_grad():
        torch.testing.assert_close(twin(ids), model(ids), rtol=1e-5, atol=1e-5)
    drop_prepacked(model)

"""``model.compile``: the compiled decoder computes what the eager one does, and a pack of
other row lengths reuses the compilation instead of compiling again."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
import torch._dynamo

from agentrl.engines.interface import SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained
from agentrl.model.compile import compile_model

pytestmark = pytest.mark.slow  # inductor compiles C++ kernels on the CPU: ~30 s


def packed_step(model, lengths: list[int], seed: int
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training forward/backward on a pack of rows of ``lengths``, the head reading
    every other position (the last layer's kept-positions path): loss and gradients."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ids = torch.randint(0, model.config.vocab_size, (1, total), generator=gen)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    positions = torch.arange(0, total, 2)
    model.zero_grad(set_to_none=True)
    scores = model(ids, cu_seqlens=cu, targets=ids.roll(-1, 1), positions=positions,
                   bounds=cu.tolist())
    loss = -scores.logprobs.reshape(-1)[positions].mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager-ac-off", "ac-on"])
def test_compiled_training_step_equals_eager_and_does_not_recompile(tiny_qwen3, checkpointing):
    torch._dynamo.reset()
    eager = load_pretrained(tiny_qwen3, attention="torch")
    eager.configure_memory(checkpointing)
    compiled = copy.deepcopy(eager)
    compile_model(compiled)
    for step, lengths in enumerate([[7, 13, 4], [9, 2, 20, 11, 5]]):
        loss, grads = packed_step(eager, lengths, step)
        # the second pack has other row lengths, a longer pack and more kept positions:
        # dynamic shapes serve it with the first pack's compilation
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            compiled_loss, compiled_grads = packed_step(compiled, lengths, step)
        torch.testing.assert_close(compiled_loss, loss, atol=1e-5, rtol=0)
        for name, grad in grads.items():
            torch.testing.assert_close(compiled_grads[name], grad, atol=1e-5, rtol=0,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_compiled_engine_generates_what_the_eager_one_does(tiny_qwen3):
    model = load_pretrained(tiny_qwen3, attention="torch").eval().requires_grad_(False)
    compiled = copy.deepcopy(model)
    compile_model(compiled)
    prompts = [[5, 9, 40, 41], [7, 8], [100, 101, 102, 103, 104, 105, 300, 301]]
    params = SamplingParams(temperature=0.0, max_tokens=10)

    async def generate(m) -> list[list[int]]:
        engine = TorchEngine(m, max_batch_size=4, max_len=64)
        done = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return [g.token_ids for g in done]

    assert asyncio.run(generate(compiled)) == asyncio.run(generate(model))


def test_compile_model_names_what_it_needs():
    with pytest.raises(ValueError, match="model.compile needs agentrl's CausalLM"):
        compile_model(torch.nn.Linear(2, 2))

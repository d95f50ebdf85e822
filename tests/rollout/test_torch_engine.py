"""TorchEngine: cached == uncached, concurrent == sequential, log-probs == trainer's."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engines.interface import InferenceEngine, SamplingParams, WeightSyncError
from agentrl.engines.sampling import scaled_logprobs, top_p_mask
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import load_pretrained

PROMPTS = [[5, 9, 40, 41], [7], [100, 101, 102, 103, 104, 105, 106, 300, 301], [3, 3]]


def uncached_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference: a full forward over the whole sequence for every new token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def trainer_logprobs(model, prompt: list[int], out: list[int], temp: float) -> list[float]:
    """What the trainer computes: one plain forward, log_softmax(logits / T) at the tokens."""
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits.float() / (temp if temp > 0 else 1.0), dim=-1)
    return lp.gather(-1, torch.tensor(out)[:, None])[:, 0].tolist()


def run(coro):
    return asyncio.run(coro)


def test_engine_satisfies_protocol(tiny_model):
    assert isinstance(TorchEngine(tiny_model), InferenceEngine)


def test_cached_greedy_equals_uncached_greedy(tiny_model):
    model = tiny_model
    engine = TorchEngine(model, max_batch_size=2, max_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    for prompt in PROMPTS:
        gen = run(engine.generate(prompt, params))
        assert gen.token_ids == uncached_greedy(model, prompt, 12)
        assert gen.finish_reason == "length"


def test_concurrent_equals_sequential_and_batches(tiny_model):
    model = tiny_model
    params = SamplingParams(temperature=0.0, max_tokens=10)
    seq_engine = TorchEngine(model, max_batch_size=4, max_len=64)
    sequential = [run(seq_engine.generate(p, params)).token_ids for p in PROMPTS]
    engine = TorchEngine(model, max_batch_size=3, max_len=64)  # fewer slots than requests

    async def together():
        return await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))

    concurrent = [g.token_ids for g in run(together())]
    assert concurrent == sequential
    # batched: far fewer forwards than 4 prompts × 10 tokens one at a time
    assert engine.num_forwards < seq_engine.num_forwards


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_equal_full_forward(tiny_model, temperature):
    model = tiny_model
    engine = TorchEngine(model, max_batch_size=4, max_len=64)
    params = SamplingParams(temperature=temperature, max_tokens=15, seed=3)

    async def together():
        return await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))

    for prompt, gen in zip(PROMPTS, run(together()), strict=True):
        expected = trainer_logprobs(model, prompt, gen.token_ids, temperature)
        assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(expected), atol=1e-4)


def test_seeded_sampling_does_not_depend_on_batch_company(tiny_model):
    model = tiny_model
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=11)
    alone = run(TorchEngine(model, max_len=64).generate(PROMPTS[0], params)).token_ids
    engine = TorchEngine(model, max_len=64)

    async def together():
        return await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))

    assert run(together())[0].token_ids == alone


def test_stop_token_ids_and_stop_strings(tiny_model, tokenizer):
    model = tiny_model
    tok = tokenizer
    greedy = uncached_greedy(model, PROMPTS[0], 12)
    engine = TorchEngine(model, tokenizer=tok, max_len=64)
    stop_id = greedy[4]
    first = greedy.index(stop_id)
    gen = run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12,
                                                         stop_token_ids=(stop_id,))))
    assert gen.token_ids == greedy[: first + 1] and gen.finish_reason == "stop"
    text = tok.decode(greedy[3:5])
    gen = run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12,
                                                         stop=(text,))))
    assert text in tok.decode(gen.token_ids) and gen.finish_reason == "stop"
    assert len(gen.token_ids) <= 5


def test_stop_strings_need_tokenizer_and_prompt_must_fit(tiny_model):
    engine = TorchEngine(tiny_model, max_len=8)
    with pytest.raises(ValueError, match="tokenizer"):
        run(engine.generate([1, 2], SamplingParams(stop=("x",))))
    with pytest.raises(ValueError, match="max_len"):
        run(engine.generate(list(range(3, 20)), SamplingParams()))
    gen = run(engine.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=50)))
    assert len(gen.token_ids) == 6 and gen.finish_reason == "length"  # slot full


def test_update_weights_in_place_changes_generation(tiny_model, tiny_ckpt):
    model = tiny_model
    engine = TorchEngine(model, max_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    before = run(engine.generate(PROMPTS[0], params)).token_ids
    other = load_pretrained(tiny_ckpt, attention="torch").eval()
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    weight = model.lm_head.weight
    engine.update_weights(other.state_dict())
    assert model.lm_head.weight is weight  # loaded in place, same tensor
    after = run(engine.generate(PROMPTS[0], params)).token_ids
    assert after == uncached_greedy(other.eval(), PROMPTS[0], 8)
    assert after != before


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = [(top_p_mask(probs, p) > 0).tolist() for p in (0.7, 0.5, 0.1, 0.96)]
    assert kept[0] == [True, True, False, False]
    assert kept[1] == [True, False, False, False]
    assert kept[2] == [True, False, False, False]
    assert kept[3] == [True, True, True, True]
    lp = scaled_logprobs(torch.tensor([2.0, 0.0]), 0.5)
    assert torch.allclose(lp, torch.log_softmax(torch.tensor([4.0, 0.0]), -1))


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_trainer_scoring_pass_reproduces_engine_logprobs(tiny_model, temperature):
    # The trainer's own path (rows → packed micro-batch → score at the rollout
    # temperature) must see the same log-probs as the engine that sampled: the PPO ratio
    # starts at exactly 1. Without dividing by the temperature this fails for T != 1.
    from agentrl.packing import collate
    from agentrl.train.update import score
    from agentrl.types import Row

    engine = TorchEngine(tiny_model, max_batch_size=4, max_len=64)
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=5)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        gen = run(engine.generate(prompt, params))
        rows.append(Row(f"r{i}", "g", "e", 0, prompt + gen.token_ids,
                        [0] * len(prompt) + [1] * len(gen.token_ids),
                        [0.0] * len(prompt) + gen.logprobs, reward=1.0))
    mb = collate(rows, [0.0] * len(rows), list(range(len(rows))))
    trainer = score(tiny_model, [mb], temperature)[0]
    mask = mb.loss_mask.bool()
    torch.testing.assert_close(trainer[mask], mb.engine_logprobs[mask], atol=1e-4, rtol=0)


async def _generate_after(engine, prompt, params, decode_steps_later: int):
    for _ in range(decode_steps_later):  # the engine decodes one step per loop turn
        await asyncio.sleep(0)
    return await engine.generate(prompt, params)


def test_batch_invariant_outputs_do_not_depend_on_the_other_requests(tiny_model):
    # train.deterministic: a request's tokens and log-probs are the same bits alone, in
    # another slot, and next to requests that join and leave at other times
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=11)
    others = SamplingParams(temperature=1.0, max_tokens=5, seed=3)
    prompt = PROMPTS[2]

    def engine():
        return TorchEngine(tiny_model, max_batch_size=4, max_len=64, batch_invariant=True)

    alone = run(engine().generate(prompt, params))

    async def crowded(e):
        return await asyncio.gather(
            e.generate(PROMPTS[0], others),                 # takes slot 0, ends early
            e.generate(prompt, params),                     # slot 1
            _generate_after(e, PROMPTS[1], others, 3),      # joins mid-way
            _generate_after(e, PROMPTS[3], params, 7),      # joins later, reuses a slot
        )

    e = engine()
    together = run(crowded(e))[1]
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs  # bit for bit, not approximately
    assert e.num_forwards > 16  # it did decode in shared steps


def test_batch_invariant_greedy_equals_the_default_engine(tiny_model):
    params = SamplingParams(temperature=0.0, max_tokens=10)
    invariant = TorchEngine(tiny_model, max_batch_size=3, max_len=64, batch_invariant=True)
    default = TorchEngine(tiny_model, max_batch_size=3, max_len=64)

    async def all_prompts(e):
        return await asyncio.gather(*(e.generate(p, params) for p in PROMPTS))

    a, b = run(all_prompts(invariant)), run(all_prompts(default))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                   atol=1e-5, rtol=0)

def test_weight_sync_session_checks_names_and_bumps_the_version(tiny_model, tiny_ckpt):
    other = load_pretrained(tiny_ckpt, attention="torch")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.0)
    engine = TorchEngine(tiny_model, max_batch_size=2, max_len=64, name="replica 7")
    pairs = list(other.named_parameters())
    with pytest.raises(WeightSyncError, match="replica 7 failed in finish.*lacks 1 param"):
        engine.update_weights(pairs[:-1])
    assert engine.weight_version == 0
    with pytest.raises(WeightSyncError, match=r"model.norm.weight \(3,\) does not match"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))])
    engine.update_weights(iter(pairs))  # one pass over an iterator
    assert engine.weight_version == 1
    for name, param in tiny_model.named_parameters():
        assert torch.equal(param, dict(pairs)[name])
    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight  # still tied


def test_sleep_frees_the_kv_cache_and_a_cancelled_caller_does_not_block_it(tiny_model):
    engine = TorchEngine(tiny_model, max_batch_size=2, max_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=40)

    async def cancel_midway():
        task = asyncio.create_task(engine.generate([1, 2, 3], params))
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancel_midway())  # the batching loop still holds the cancelled request
    engine.sleep()
    assert engine.is_sleeping and engine.kv_cache_bytes() == 2 * 2 * 2 * 8 * 2 * 64 * 4
    got = asyncio.run(engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4)))
    assert len(got.token_ids) == 4 and not engine.is_sleeping

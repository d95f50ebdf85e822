"""The built-in engine with LoRA: adapter-only syncs, one adapter version per policy version,
running requests finishing on the version they started with, every token recording it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.config import LoRAConfig
from agentrl.engines.adapters import AdapterVersions
from agentrl.engines.interface import SamplingParams, WeightSyncError
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model.lora import adapter_parameters, add_adapters, initial_adapter_state
from tests.test_update import ARGS, make_model

LORA = LoRAConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "up_proj",
                                                     "down_proj"])
PROMPT = [3, 14, 15, 9, 26]


def adapters(seed: int | None) -> dict[str, torch.Tensor]:
    """Trained-looking adapters (every tensor random), or fresh ones (B = 0) for None."""
    state = initial_adapter_state(ARGS, LORA, seed=0)
    if seed is None:
        return state
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=generator) * 0.3 for k, v in state.items()}


def lora_engine(**kwargs) -> TorchEngine:
    model = make_model().eval().requires_grad_(False)
    return TorchEngine(model, max_batch_size=4, max_len=64, batch_invariant=True,
                       adapters=AdapterVersions(model, LORA, **kwargs))


def params(seed: int, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed)


def generate(engine: TorchEngine, seed: int, max_tokens: int = 12):
    return asyncio.run(engine.generate(PROMPT, params(seed, max_tokens)))


def test_a_fresh_adapter_generates_exactly_what_the_base_model_does() -> None:
    base = TorchEngine(make_model().eval(), max_batch_size=4, max_len=64, batch_invariant=True)
    engine = lora_engine()
    engine.update_weights(adapters(None).items(), version=0)
    ours, theirs = generate(engine, seed=5), generate(base, seed=5)
    assert ours.token_ids == theirs.token_ids and ours.logprobs == theirs.logprobs


def test_the_engine_generates_what_the_trainer_model_computes() -> None:
    trained = adapters(seed=1)
    engine = lora_engine()
    engine.update_weights(trained.items(), version=3)
    out = generate(engine, seed=2)
    assert engine.weight_version == 3 and out.versions == [3] * len(out.token_ids)
    model = make_model()
    add_adapters(model, LORA)
    model.load_state_dict(trained, strict=False)
    ids = torch.tensor([PROMPT + out.token_ids[:-1]])
    with torch.no_grad():
        logits = model(ids)[0, len(PROMPT) - 1:].float()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])
    torch.testing.assert_close(torch.tensor(out.logprobs), expected[:, 0], atol=1e-4,
                               rtol=1e-4)


def test_a_sync_while_a_request_runs_keeps_its_version_until_it_ends() -> None:
    v0, v1 = adapters(seed=1), adapters(seed=2)
    only_v0, only_v1 = lora_engine(), lora_engine()
    only_v0.update_weights(v0.items(), version=0)
    only_v1.update_weights(v1.items(), version=1)
    alone_old = generate(only_v0, seed=7, max_tokens=20)
    alone_new = generate(only_v1, seed=8, max_tokens=6)

    engine = lora_engine()
    engine.update_weights(v0.items(), version=0)
    live_during: list[set[int]] = []

    async def main():
        old = asyncio.create_task(engine.generate(PROMPT, params(7, max_tokens=20)))
        for _ in range(5):  # the old request is admitted and decodes a few tokens
            await asyncio.sleep(0)
        assert engine.keeps_adapter_versions
        engine.update_weights(v1.items(), version=1, in_flight=True)
        new = await engine.generate(PROMPT, params(8, max_tokens=6))
        live_during.append(set(engine.adapters.live))
        return await old, new

    old, new = asyncio.run(main())
    assert live_during == [{0, 1}]  # v0 kept for the running request
    assert old.versions == [0] * 20 and new.versions == [1] * 6
    assert old.token_ids == alone_old.token_ids and old.logprobs == alone_old.logprobs
    assert new.token_ids == alone_new.token_ids and new.logprobs == alone_new.logprobs
    assert set(engine.adapters.live) == {1}  # nobody uses v0 any more: dropped


def test_in_flight_updates_move_running_requests_to_the_new_version() -> None:
    engine = lora_engine(move_running=True)
    engine.update_weights(adapters(1).items(), version=0)

    async def main():
        task = asyncio.create_task(engine.generate(PROMPT, params(3, max_tokens=20)))
        for _ in range(5):
            await asyncio.sleep(0)
        engine.update_weights(adapters(2).items(), version=1, in_flight=True)
        return await task

    out = asyncio.run(main())
    assert out.versions[0] == 0 and out.versions[-1] == 1
    assert out.versions == sorted(out.versions)


def test_a_lora_engine_refuses_full_weights_and_incomplete_adapters() -> None:
    engine = lora_engine()
    with pytest.raises(WeightSyncError, match="not one of this engine's LoRA adapters"):
        engine.update_weights(make_model().state_dict().items(), version=1)
    partial = dict(list(adapters(1).items())[:3])
    with pytest.raises(WeightSyncError, match="lacks"):
        engine.update_weights(partial.items(), version=1)
    assert engine.weight_version == 0


def test_adapter_names_are_what_the_trainer_model_holds() -> None:
    model = make_model()
    add_adapters(model, LORA)
    engine = lora_engine()
    assert set(engine.adapters.shapes) == {n for n, _ in adapter_parameters(model)}


@pytest.mark.parametrize("sync_during_turn_1", [False, True])
def test_a_next_turn_never_continues_a_cache_of_another_adapter_version(
        sync_during_turn_1: bool) -> None:
    # prefix reuse on (not batch invariant): the rollout's next turn, under v1, must not
    # continue the slot its first turn filled under v0, whether v1 came between the turns
    # or while turn 1 ran (its slot then goes idle after the sync)
    v0, v1 = adapters(seed=1), adapters(seed=2)

    def engine_at(state, version):
        model = make_model().eval().requires_grad_(False)
        engine = TorchEngine(model, max_batch_size=4, max_len=64,
                             adapters=AdapterVersions(model, LORA))
        engine.update_weights(state.items(), version=version)
        return engine

    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    engine = engine_at(v0, 0)

    async def two_turns():
        turn_1 = asyncio.create_task(engine.generate(PROMPT, greedy, key="r"))
        for _ in range(3 if sync_during_turn_1 else 0):
            await asyncio.sleep(0)
        if not sync_during_turn_1:
            await turn_1
        engine.update_weights(v1.items(), version=1, in_flight=True)
        first = await turn_1
        turn_2 = PROMPT + first.token_ids + [7, 7]
        return first, turn_2, await engine.generate(turn_2, greedy, key="r")

    first, turn_2, second = asyncio.run(two_turns())
    assert first.versions == [0] * 8 and second.versions == [1] * 8
    fresh = asyncio.run(engine_at(v1, 1).generate(turn_2, greedy))
    assert second.token_ids == fresh.token_ids
    torch.testing.assert_close(torch.tensor(second.logprobs), torch.tensor(fresh.logprobs),
                               atol=1e-5, rtol=1e-5)


def test_a_request_admitted_before_the_first_sync_finishes_on_the_base_model() -> None:
    """Version 0 before any sync is the base (no adapter installed): a sync that arrives
    while such a request runs must not leave it without an adapter to look up."""
    base = TorchEngine(make_model().eval(), max_batch_size=4, max_len=64, batch_invariant=True)
    alone_base = generate(base, seed=7, max_tokens=20)
    only_v1 = lora_engine()
    only_v1.update_weights(adapters(seed=2).items(), version=1)
    alone_new = generate(only_v1, seed=8, max_tokens=6)

    engine = lora_engine()  # no sync yet: the base model, version 0

    async def main():
        old = asyncio.create_task(engine.generate(PROMPT, params(7, max_tokens=20)))
        for _ in range(5):  # admitted at version 0, decoding
            await asyncio.sleep(0)
        engine.update_weights(adapters(seed=2).items(), version=1, in_flight=True)
        new = await engine.generate(PROMPT, params(8, max_tokens=6))  # beside the old one
        return await old, new

    old, new = asyncio.run(main())
    assert old.versions == [0] * 20 and new.versions == [1] * 6
    assert old.token_ids == alone_base.token_ids and old.logprobs == alone_base.logprobs
    assert new.token_ids == alone_new.token_ids and new.logprobs == alone_new.logprobs


def test_the_drop_rule_keeps_the_newest_and_the_versions_in_use():
    from agentrl.engines.adapters import unused_versions

    assert unused_versions([1, 2, 3, 4], 4, {2}) == [1, 3]
    assert unused_versions([4], 4, set()) == []
    assert unused_versions([1, 2], None, {1}) == [2]  # before a newest: only use keeps

"""One update's gradient does not depend on the layout: micro-batches, budget, row order.

Also: a per-micro-batch mean WOULD change the gradient (so these tests can fail), empty
padding micro-batches change nothing, scoring is exact, clipping measures the right norm.
"""

from __future__ import annotations

import random

import msgspec
import pytest
import torch
from torch import nn

from agentrl.config import LossConfig
from agentrl.loss import policy_loss, token_logprobs
from agentrl.model import ModelArgs
from agentrl.model.tiny import init_model
from agentrl.packing import CostModel, MicroBatch, collate, pack, plan_micro_batches
from agentrl.parallel.fsdp import clip_grad_norm
from agentrl.train.update import forward_backward, score, with_logprobs
from agentrl.types import Row

VOCAB = 97
CFG = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0, tis_cap=2.0)
COST = CostModel.from_model_args(hidden=32, layers=2, intermediate=64, vocab=VOCAB)


ARGS = ModelArgs(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
)


def make_model(seed: int = 0) -> nn.Module:
    """The real tiny decoder (PyTorch varlen attention); same seed → same weights."""
    return init_model(ARGS, seed)


def make_rows(num_rows: int = 12, seed: int = 0) -> tuple[list[Row], list[float]]:
    """Rows with a prompt, generated turns and observations between them; one invalid."""
    rng = random.Random(seed)
    rows, advantages = [], []
    for k in range(num_rows):
        num_prompt = rng.randint(2, 6)
        mask = [0] * num_prompt
        for _ in range(rng.randint(1, 3)):
            mask += [1] * rng.randint(1, 8) + [0] * rng.randint(0, 4)
        tokens = [rng.randrange(VOCAB) for _ in mask]
        logprobs = [-rng.uniform(0.5, 5.0) if m else 0.0 for m in mask]
        rows.append(Row(rollout_id=f"r{k}", group_id=f"g{k // 4}", env="e", segment=0,
                        token_ids=tokens, loss_mask=mask, logprobs=logprobs,
                        reward=float(k % 2), valid=k != 5, num_prompt_tokens=num_prompt))
        advantages.append(0.0 if k == 5 else rng.uniform(-1.5, 1.5))
    return rows, advantages


def micro_batches_for(rows: list[Row], advantages: list[float], groups: list[list[int]]
                      ) -> list[MicroBatch]:
    """Collate each group of row indices into one micro-batch."""
    return [collate(rows, advantages, g) for g in groups]


def gradient(model: nn.Module, mbs: list[MicroBatch], cfg: LossConfig = CFG) -> torch.Tensor:
    """The flattened gradient of one forward_backward over ``mbs``, from zero."""
    model.zero_grad(set_to_none=True)
    forward_backward(model, mbs, cfg)
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "checkpointed"])
def setup(request) -> tuple[nn.Module, list[Row], list[float], torch.Tensor]:
    # every invariance below holds with activation checkpointing on as well
    model = make_model()
    model.configure_memory(activation_checkpointing=request.param, logprob_chunk_tokens=16)
    rows, advantages = make_rows()
    # old log-probs are the rows' engine ones: ratios differ from 1, TIS weights are live
    one = micro_batches_for(rows, advantages, [list(range(len(rows)))])
    reference = gradient(model, one)
    return model, rows, advantages, reference


def test_the_checkpointed_variant_recomputes_every_layer_in_backward(setup) -> None:
    """The "checkpointed" parameter really turns checkpointing on: each layer's block runs
    once in forward and once more in backward; the plain variant runs it once."""
    model, rows, advantages, _ = setup
    layers = model.model.layers
    calls = [0]

    def counted(block):
        def run(*args):
            calls[0] += 1
            return block(*args)
        return run

    for layer in layers:
        layer._block = counted(layer._block)
    try:
        gradient(model, micro_batches_for(rows, advantages, [list(range(len(rows)))]))
    finally:
        for layer in layers:
            del layer._block
    per_layer = 2 if layers[0].activation_checkpointing else 1
    assert calls[0] == per_layer * len(layers)


def test_same_gradient_in_one_or_many_micro_batches(setup) -> None:
    model, rows, advantages, reference = setup
    lengths = [len(r.token_ids) for r in rows]
    many = micro_batches_for(rows, advantages, pack(lengths, max(lengths)))
    assert len(many) > 3
    singles = micro_batches_for(rows, advantages, [[i] for i in range(len(rows))])
    other_budget = micro_batches_for(rows, advantages, pack(lengths, 2 * max(lengths) + 7))
    for mbs in (many, singles, other_budget):
        assert torch.allclose(gradient(model, mbs), reference, atol=1e-6, rtol=0)
    assert reference.abs().max() > 1e-3  # the comparison is not between zeros


def test_same_gradient_with_shuffled_rows_and_empty_padding(setup) -> None:
    model, rows, advantages, reference = setup
    order = list(range(len(rows)))
    random.Random(3).shuffle(order)
    shuffled_rows = [rows[i] for i in order]
    shuffled_adv = [advantages[i] for i in order]
    lengths = [len(r.token_ids) for r in shuffled_rows]
    groups = pack(lengths, 40) + [[], []]  # two padding micro-batches, as a short rank gets
    mbs = micro_batches_for(shuffled_rows, shuffled_adv, groups)
    assert torch.allclose(gradient(model, mbs), reference, atol=1e-6, rtol=0)


def test_per_micro_batch_mean_would_change_the_gradient(setup) -> None:
    model, rows, advantages, reference = setup
    lengths = [len(r.token_ids) for r in rows]
    mbs = micro_batches_for(rows, advantages, pack(lengths, max(lengths)))
    model.zero_grad(set_to_none=True)
    for mb in mbs:  # the wrong way: each micro-batch divided by its own tokens
        logprobs = token_logprobs(model(mb.input_ids, mb.position_ids, mb.cu_seqlens),
                                  mb.target_ids)
        loss, _ = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask,
                              max(mb.num_tokens, 1), CFG)
        (loss / len(mbs)).backward()
    wrong = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert (wrong - reference).abs().max() > 1e-4


def test_invariance_holds_off_policy_with_clipping(setup) -> None:
    """After an optimizer step the ratios leave 1 and clip; the layout still does not matter."""
    checkpointed, rows, advantages, _ = setup
    model = make_model(seed=1)
    model.configure_memory(checkpointed.model.layers[0].activation_checkpointing, 16)
    lengths = [len(r.token_ids) for r in rows]
    groups_one, groups_many = [list(range(len(rows)))], pack(lengths, max(lengths))
    old = [score(model, micro_batches_for(rows, advantages, g)) for g in (groups_one, groups_many)]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    # the pre-step policy doubles as the KL reference, so the KL term is live too
    one = [msgspec.structs.replace(mb, ref_logprobs=mb.old_logprobs) for mb in
           with_logprobs(micro_batches_for(rows, advantages, groups_one), old[0])]
    many = [msgspec.structs.replace(mb, ref_logprobs=mb.old_logprobs) for mb in
            with_logprobs(micro_batches_for(rows, advantages, groups_many), old[1])]
    cfg = msgspec.structs.replace(CFG, kl_coef=0.5)
    model.zero_grad(set_to_none=True)
    stats = forward_backward(model, one, cfg)
    assert stats.clip_frac_low + stats.clip_frac_high > 0  # clipping is exercised
    assert stats.kl_loss > 0
    grad_one = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(gradient(model, many, cfg), grad_one, atol=1e-6, rtol=0)
    assert (gradient(model, many, CFG) - grad_one).abs().max() > 1e-5  # KL changed it


def test_first_update_stats_by_hand(setup) -> None:
    model, rows, advantages, _ = setup
    mbs = micro_batches_for(rows, advantages, pack([len(r.token_ids) for r in rows], 64))
    mbs = with_logprobs(mbs, score(model, mbs))  # on-policy: every ratio is 1
    model.zero_grad(set_to_none=True)
    stats = forward_backward(model, mbs, CFG)
    # generated targets of valid rows: mask entries after the first token, row 5 excluded
    expected_tokens = sum(sum(r.loss_mask[1:]) for k, r in enumerate(rows) if k != 5)
    assert stats.num_tokens == expected_tokens
    # ratio 1 → pg = -A·tis per token; tis = min(π_old/π_engine, 2)
    weighted = sum(
        float((-mb.advantages * (mb.old_logprobs - mb.engine_logprobs).exp().clamp(max=2.0)
               * mb.loss_mask).sum()) for mb in mbs
    )
    assert stats.loss == pytest.approx(weighted / expected_tokens, rel=1e-5)
    assert stats.clip_frac_low == 0 and stats.clip_frac_high == 0
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-7)
    assert 0 < stats.entropy < torch.log(torch.tensor(float(VOCAB))).item()
    assert stats.num_micro_batches == len(mbs)


def test_packed_scores_equal_per_row_scores(setup) -> None:
    model, rows, advantages, _ = setup
    packed = score(model, micro_batches_for(rows, advantages, [list(range(len(rows)))]))[0]
    per_row = score(model, micro_batches_for(rows, advantages, [[i] for i in range(len(rows))]))
    assert torch.allclose(packed, torch.cat(per_row, dim=1), atol=1e-6)


def test_packed_scores_equal_a_dense_forward_of_every_whole_row(setup) -> None:
    """Each row's last token is left out of the pack (it predicts nothing, nothing attends
    to it), yet every generated token, the last one included, gets the log-prob a dense
    forward of the whole row gives it."""
    model, rows, advantages, _ = setup
    mb = micro_batches_for(rows, advantages, [list(range(len(rows)))])[0]
    assert mb.input_ids.shape[1] == sum(len(r.token_ids) - 1 for r in rows)
    packed = score(model, [mb])[0][mb.loss_mask.bool()]
    dense = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row.token_ids])
            logprobs = torch.log_softmax(model(ids)[0, :-1].float(), dim=-1)
            scored = logprobs.gather(1, ids[0, 1:, None])[:, 0]
            dense.append(scored[torch.tensor(row.loss_mask[1:], dtype=torch.bool)]
                         if row.valid else scored[:0])
    assert packed.numel() == sum(sum(r.loss_mask[1:]) for r in rows if r.valid)
    assert any(r.loss_mask[-1] for r in rows if r.valid)  # last tokens among them
    torch.testing.assert_close(packed, torch.cat(dense), atol=1e-5, rtol=0)


def test_plan_with_empty_micro_batches_runs() -> None:
    model = make_model()
    rows, advantages = make_rows(num_rows=3)
    plan = plan_micro_batches([len(r.token_ids) for r in rows], 64, 4, COST)
    assert any(mb == [] for p in plan for mb in p)  # 3 rows on 4 ranks: one rank idle
    idle = next(p for p in plan if all(mb == [] for mb in p))
    model.zero_grad(set_to_none=True)
    stats = forward_backward(model, micro_batches_for(rows, advantages, idle), CFG)
    assert stats.num_tokens == 0 and stats.loss == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())


def test_clip_grad_norm_measures_and_clips(setup) -> None:
    model, rows, advantages, reference = setup
    gradient(model, micro_batches_for(rows, advantages, [list(range(len(rows)))]))
    norm = float(reference.norm())
    assert clip_grad_norm(model, 0.0) == pytest.approx(norm, rel=1e-5)  # measure only
    assert clip_grad_norm(model, norm / 4) == pytest.approx(norm, rel=1e-5)
    clipped = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert float(clipped.norm()) == pytest.approx(norm / 4, rel=1e-4)


@pytest.mark.parametrize("objective", ["ppo", "decoupled"])
def test_first_update_forward_stands_in_for_its_scoring_pass(setup, objective) -> None:
    """A collection's first update trains the weights its old (proximal) policy was scored
    with: its own detached log-probs give the same loss, figures and gradient as a
    scoring pass, which the trainer therefore skips for it."""
    model, rows, advantages, _ = setup
    lengths = [len(r.token_ids) for r in rows]
    mbs = micro_batches_for(rows, advantages, pack(lengths, max(lengths)))
    cfg = msgspec.structs.replace(CFG, objective=objective, negative_advantage_veto=1.5)
    scored = with_logprobs(mbs, score(model, mbs))
    model.zero_grad(set_to_none=True)
    by_scoring = forward_backward(model, scored, cfg)
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    by_forward = forward_backward(model, mbs, cfg, old_is_current=True)
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(got, expected, atol=1e-7, rtol=0)
    for name in ("loss", "tis_weight", "mismatch", "approx_kl", "veto_frac"):
        assert getattr(by_forward, name) == pytest.approx(getattr(by_scoring, name), abs=1e-7)
    assert by_forward.tis_weight < 1.0  # the behaviour weights are live, not all 1
    # the old policy matters: one off by a constant gives another gradient
    model.zero_grad(set_to_none=True)
    forward_backward(model, with_logprobs(mbs, [lp - 0.3 for lp in score(model, mbs)]), cfg)
    other_old = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert (other_old - expected).abs().max() > 1e-4

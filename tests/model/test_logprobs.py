"""The training forward's chunked log-probs equal log_softmax over the full logits.

Log-probs, entropy and every parameter's gradient, in fp32, for several chunk sizes, a
temperature != 1, packed rows (cu_seqlens), tied and untied LM heads, and with activation
checkpointing on; plus: the [T, V] logits never exist.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.model import ModelArgs
from agentrl.model.logprobs import chunked_target_logprobs, target_logprobs
from agentrl.model.tiny import init_model

VOCAB = 101
CU_SEQLENS = torch.tensor([0, 9, 10, 31, 48], dtype=torch.int32)  # 4 rows, one of 1 token
TOTAL = 48


def _model(tied: bool):
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=8, attention_bias=True, tie_word_embeddings=tied)
    return init_model(args, seed=3)


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(VOCAB, (1, TOTAL), generator=g)
    targets = torch.randint(VOCAB, (1, TOTAL), generator=g)
    weights = torch.randn(1, TOTAL, generator=g)  # a loss that weighs every token differently
    return ids, targets, weights


def _reference(model, ids, targets, weights, temperature):
    """Today's path: full logits, log_softmax in float64, entropy from the probabilities."""
    model.zero_grad(set_to_none=True)
    logits = model(ids, cu_seqlens=CU_SEQLENS)
    assert logits.shape == (1, TOTAL, VOCAB)
    logp_v = torch.log_softmax(logits.double() / temperature, dim=-1)
    logprobs = logp_v.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_v.exp() * logp_v).sum(-1)
    (logprobs * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logprobs.detach(), entropy.detach(), grads


def _chunked(model, ids, targets, weights, temperature):
    model.zero_grad(set_to_none=True)
    scores = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, temperature=temperature)
    assert scores.logprobs.dtype == torch.float32 and scores.logprobs.shape == (1, TOTAL)
    assert not scores.entropy.requires_grad
    (scores.logprobs * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return scores.logprobs.detach(), scores.entropy, grads


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 16, 48, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_scores_and_gradients_equal_the_full_logits_path(tied, chunk, temperature):
    model = _model(tied)
    ids, targets, weights = _batch()
    ref_lp, ref_ent, ref_grads = _reference(model, ids, targets, weights, temperature)
    model.configure_memory(activation_checkpointing=False, logprob_chunk_tokens=chunk)
    lp, ent, grads = _chunked(model, ids, targets, weights, temperature)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-5, msg=name)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert ref_grads[head].abs().max() > 1e-3  # the head's gradient is really compared


def test_temperature_changes_the_log_probs():
    # the comparison above would hold vacuously if the temperature were ignored
    model = _model(tied=True)
    ids, targets, _ = _batch()
    with torch.no_grad():
        one = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, temperature=1.0).logprobs
        hot = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, temperature=0.7).logprobs
        greedy = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, temperature=0.0).logprobs
    assert (one - hot).abs().max() > 1e-3
    torch.testing.assert_close(greedy, one, atol=0, rtol=0)  # T = 0 reports T = 1


def test_activation_checkpointing_changes_no_value_or_gradient():
    model = _model(tied=True)
    ids, targets, weights = _batch(seed=1)
    model.configure_memory(activation_checkpointing=False, logprob_chunk_tokens=16)
    lp, _, grads = _chunked(model, ids, targets, weights, 0.7)
    model.configure_memory(activation_checkpointing=True, logprob_chunk_tokens=16)
    lp_ac, _, grads_ac = _chunked(model, ids, targets, weights, 0.7)
    torch.testing.assert_close(lp_ac, lp, atol=0, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, atol=1e-6, rtol=1e-6, msg=name)


class _LargestOutput(TorchDispatchMode):
    """Records the element count of the largest tensor any op creates."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest_tensor_of_forward_backward(model, ids, targets, full_logits: bool) -> int:
    with _LargestOutput() as mode:
        if full_logits:
            logits = model(ids, cu_seqlens=CU_SEQLENS)
            target_logprobs(logits, targets).sum().backward()
        else:
            model(ids, cu_seqlens=CU_SEQLENS, targets=targets).logprobs.sum().backward()
    return mode.largest


def test_no_tensor_of_the_whole_micro_batch_times_vocabulary_is_ever_created():
    # H=32, intermediate 64, V=101, T=48: only the logits (or their gradient) reach T·V
    model = _model(tied=False)
    ids, targets, _ = _batch()
    model.configure_memory(activation_checkpointing=True, logprob_chunk_tokens=8)
    chunked = _largest_tensor_of_forward_backward(model, ids, targets, full_logits=False)
    assert chunked < TOTAL * VOCAB
    assert chunked == VOCAB * 32  # the head's weight gradient [V, H]: more than 8·V
    full = _largest_tensor_of_forward_backward(model, ids, targets, full_logits=True)
    assert full >= TOTAL * VOCAB  # the check sees the full-logits path


def test_the_forward_saves_the_hidden_states_not_the_logits():
    torch.manual_seed(0)
    hidden = torch.randn(TOTAL, 16, requires_grad=True)
    weight = torch.randn(VOCAB, 16, requires_grad=True)
    targets = torch.randint(VOCAB, (TOTAL,))
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        lp, _ = chunked_target_logprobs(hidden, weight, targets, 1.0, chunk=8)
    assert [tuple(t.shape) for t in saved] == [(TOTAL, 16), (VOCAB, 16), (TOTAL,), (TOTAL,)]
    expected = target_logprobs(hidden.detach() @ weight.detach().T, targets)
    torch.testing.assert_close(lp.detach(), expected, atol=1e-5, rtol=0)


def test_bad_targets_and_chunk_are_refused():
    model = _model(tied=True)
    ids, targets, _ = _batch()
    with pytest.raises(ValueError, match="targets have shape"):
        model(ids, cu_seqlens=CU_SEQLENS, targets=targets[:, :-1])
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        model.configure_memory(activation_checkpointing=False, logprob_chunk_tokens=0)


def test_scoring_passes_skip_the_entropy_and_get_the_same_logprobs():
    torch.manual_seed(0)
    hidden = torch.randn(TOTAL, 16)
    weight = torch.randn(VOCAB, 16)
    targets = torch.randint(VOCAB, (TOTAL,))
    with_entropy = chunked_target_logprobs(hidden, weight, targets, 0.7, chunk=8)
    without = chunked_target_logprobs(hidden, weight, targets, 0.7, chunk=8,
                                      with_entropy=False)
    assert without.entropy is None and with_entropy.entropy is not None
    assert torch.equal(without.logprobs, with_entropy.logprobs)
    # the entropy of a uniform distribution is log V: the flag did not break the figure
    uniform = chunked_target_logprobs(torch.zeros(3, 16), weight, targets[:3], 1.0, chunk=2)
    torch.testing.assert_close(uniform.entropy, torch.full((3,), math.log(VOCAB)))


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_the_head_runs_only_where_scores_are_needed(tied, chunk, checkpointing):
    """With ``positions`` (the generated tokens) the needed positions get the same log-probs
    and entropy as the full path, the rest read 0, and the gradient equals the full
    path's with the unneeded positions weighted 0; none needed still gives every
    parameter a (zero) gradient, as a rank with only padding must."""
    model = _model(tied)
    model.configure_memory(activation_checkpointing=checkpointing, logprob_chunk_tokens=chunk)
    ids, targets, weights = _batch(seed=1)
    needed = torch.rand(1, TOTAL, generator=torch.Generator().manual_seed(2)) < 0.3
    assert 0 < int(needed.sum()) < TOTAL
    positions = needed.reshape(-1).nonzero().squeeze(-1)
    ref_lp, ref_ent, ref_grads = _reference(model, ids, targets, weights * needed, 0.7)
    model.zero_grad(set_to_none=True)
    scores = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, temperature=0.7,
                   positions=positions)
    (scores.logprobs * weights).sum().backward()  # unneeded positions carry weight too
    torch.testing.assert_close(scores.logprobs.detach().double(), ref_lp * needed,
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(scores.entropy.double(), ref_ent * needed, atol=1e-5, rtol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], atol=1e-5, rtol=1e-5,
                                   msg=name)
    model.zero_grad(set_to_none=True)
    none = model(ids, cu_seqlens=CU_SEQLENS, targets=targets, positions=positions[:0])
    assert not none.logprobs.any()
    none.logprobs.sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    with pytest.raises(ValueError, match="positions have shape"):
        model(ids, cu_seqlens=CU_SEQLENS, targets=targets, positions=needed)


def test_the_last_layer_goes_past_attention_only_at_the_needed_positions():
    """With ``positions`` the last decoder layer's MLP sees only those rows (the head
    reads nothing else); the layers before it, whose outputs every later position's
    attention reads, see all of them."""
    model = _model(tied=True)
    ids, targets, _ = _batch(seed=1)
    positions = torch.tensor([3, 4, 5, 20, 40])
    seen = []
    hooks = [layer.mlp.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape))
             for layer in model.model.layers]
    model(ids, cu_seqlens=CU_SEQLENS, targets=targets, positions=positions)
    for hook in hooks:
        hook.remove()
    assert seen == [torch.Size([1, TOTAL, 32]), torch.Size([5, 32])]

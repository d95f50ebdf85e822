"""Activation checkpointing and the chunked log-prob head under FSDP2 (2 gloo ranks).

The model is sharded by the trainer's own ``shard_model``: each decoder layer its own
``fully_shard`` unit, the root holding the embeddings, the final norm and the (tied) LM
head, gradients summed over ranks. With checkpointing
on, FSDP2 must gather a layer's parameters again for its recomputation in backward, and
the head must read its gathered weight inside the model's forward. The summed gradient
over both ranks must equal one process's gradient over both ranks' data without
checkpointing or sharding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.model import ModelArgs
from agentrl.model.tiny import init_model
from tests.parallel.ranks import spawn_ranks

NUM_RANKS = 2
VOCAB = 97
ARGS = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 attention_bias=True, tie_word_embeddings=True)
TEMPERATURE = 0.8


def _batch(rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s packed micro-batch: three rows of different lengths."""
    g = torch.Generator().manual_seed(100 + rank)
    lengths = [11, 23, 6] if rank == 0 else [17, 4, 19]
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {"ids": torch.randint(VOCAB, (1, total), generator=g),
            "targets": torch.randint(VOCAB, (1, total), generator=g),
            "weights": torch.randn(1, total, generator=g), "cu": cu}


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    scores = model(batch["ids"], cu_seqlens=batch["cu"], targets=batch["targets"],
                   temperature=TEMPERATURE)
    return (scores.logprobs * batch["weights"]).sum()


def _worker(rank: int, out_dir: str) -> None:
    from agentrl.parallel.fsdp import shard_model

    model = init_model(ARGS, seed=0)
    model.configure_memory(activation_checkpointing=True, logprob_chunk_tokens=5)
    shard_model(model, None, torch.device("cpu"))  # as the trainer shards it: gradients sum
    _loss(model, _batch(rank)).backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    torch.save(grads, Path(out_dir) / f"rank{rank}.pt")


def test_checkpointed_layers_and_chunked_head_under_fully_shard(tmp_path: Path) -> None:
    spawn_ranks(NUM_RANKS, _worker, str(tmp_path))
    model = init_model(ARGS, seed=0)
    model.configure_memory(activation_checkpointing=False)
    for rank in range(NUM_RANKS):
        _loss(model, _batch(rank)).backward()
    reference = {name: p.grad for name, p in model.named_parameters()}
    for rank in range(NUM_RANKS):
        grads = torch.load(tmp_path / f"rank{rank}.pt")
        assert grads.keys() == reference.keys()  # parameter names unchanged by checkpointing
        for name, grad in grads.items():
            # the trainer's sharding sums over ranks, as the reference summed both batches
            torch.testing.assert_close(grad, reference[name], atol=1e-5, rtol=1e-5, msg=name)
    assert reference["model.embed_tokens.weight"].abs().max() > 1e-3

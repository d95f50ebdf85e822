"""Rows → fixed-budget packed micro-batches, balanced across data-parallel ranks.

Three steps, each a small function:

1. ``balance``: rows → ranks, so that every rank's estimated compute a·L + b·L² is even
   (LPT greedy, then pairwise swaps between the heaviest and the lightest rank).
2. ``pack``: one rank's rows → micro-batches of at most ``max_tokens`` tokens
   (best-fit decreasing).
3. ``plan_micro_batches``: both, then pads the ranks with fewer micro-batches with
   empty ones, because every rank must call the model (and so every collective) the
   same number of times or the update deadlocks.

``collate`` then turns one micro-batch's rows into one dense row with ``cu_seqlens`` so that
attention never crosses rows, and aligns every per-token field to next-token targets.
Its three speed features, none of which changes what is trained (one host-to-device
copy per micro-batch, the last tokens that do no work left out, shape padding), live in
``agentrl.collate_speed``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import msgspec
import numpy as np
import torch

from agentrl.collate_speed import copy_to_device, dead_ends, padding_row, shape_padding
from agentrl.shared_prefix import Piece, pieces
from agentrl.staleness import token_versions
from agentrl.types import Row


class CostModel(msgspec.Struct, frozen=True):
    """Estimated training FLOPs of one row of L tokens: ``a·L + b·L²``."""

    a: float
    """FLOPs per token that do not depend on the row length (the dense matmuls)."""
    b: float
    """FLOPs per token pair (causal attention scores and their weighted sum)."""

    def cost(self, length: int) -> float:
        """Estimated FLOPs of forward + backward over one row of ``length`` tokens."""
        return self.a * length + self.b * length * length

    @classmethod
    def from_model_args(
        cls,
        hidden: int,
        layers: int,
        intermediate: int | None = None,
        vocab: int = 0,
        num_kv_heads_ratio: float = 1.0,
    ) -> CostModel:
        """Derive a and b from the model's shape (forward + backward = 3 × forward).

        a = 6 · (matmul parameters touched per token): per layer the q/o projections
        (2·h²), the k/v projections (2·h²·num_kv_heads_ratio, < 1 with GQA) and a gated
        MLP (3·h·intermediate, intermediate defaulting to 4·h); plus the LM head (h·vocab).
        b = 6 · layers · hidden: QKᵀ and the weighted sum of V cost 2·2·h FLOPs per
        (query, key) pair; a causal row of L tokens has ≈ L²/2 pairs; × 3 for backward.
        """
        if hidden < 1 or layers < 1:
            raise ValueError(
                f"CostModel.from_model_args needs hidden >= 1 and layers >= 1, got hidden="
                f"{hidden}, layers={layers}; pass the model config's hidden_size and "
                "num_hidden_layers"
            )
        ffn = intermediate if intermediate is not None else 4 * hidden
        per_layer = 2 * hidden * hidden * (1 + num_kv_heads_ratio) + 3 * hidden * ffn
        params_per_token = layers * per_layer + hidden * vocab
        return cls(a=6.0 * params_per_token, b=6.0 * layers * hidden)


class PackingReport(msgspec.Struct):
    """What a plan achieved."""

    num_rows: int
    num_tokens: int
    num_micro_batches: int
    """Micro-batches per rank (the same on every rank), times the number of ranks."""
    density: float
    """Real tokens / (micro-batches × budget): 1.0 means no budget was left unused."""
    balance: float
    """Max / mean estimated cost over ranks: 1.0 is perfectly even."""


def pack(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices per micro-batch: each row once, each micro-batch within ``max_tokens``.

    Best-fit decreasing: longest rows first, each into the fullest micro-batch it still
    fits (a sorted list of free space makes that a bisect), else a new micro-batch.
    """
    _check_lengths(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    free_keys: list[tuple[int, int]] = []  # (free tokens, bin index), sorted
    for i in order:
        pos = bisect.bisect_left(free_keys, (lengths[i], -1))
        if pos == len(free_keys):
            bins.append([i])
            bisect.insort(free_keys, (max_tokens - lengths[i], len(bins) - 1))
            continue
        free, b = free_keys.pop(pos)
        bins[b].append(i)
        bisect.insort(free_keys, (free - lengths[i], b))
    return bins


def _check_lengths(lengths: Sequence[int], max_tokens: int) -> None:
    if max_tokens < 1:
        raise ValueError(
            f"max_tokens is {max_tokens}; batch.max_tokens_per_microbatch must be >= 1"
        )
    for i, length in enumerate(lengths):
        if length > max_tokens:
            raise ValueError(
                f"row {i} has {length} tokens, more than the micro-batch budget of "
                f"{max_tokens}; raise batch.max_tokens_per_microbatch to at least {length} "
                "(or lower the context budget so rows stay shorter)"
            )
        if length < 1:
            raise ValueError(f"row {i} has {length} tokens; a row needs at least one token")


def balance(lengths: Sequence[int], num_ranks: int, cost: CostModel) -> list[list[int]]:
    """Row indices per data-parallel rank with the estimated costs as even as possible.

    LPT (costliest row first, onto the cheapest rank), then swaps or moves between the
    costliest and the cheapest rank while one narrows their gap.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks is {num_ranks}; train.num_ranks must be >= 1")
    costs = np.array([cost.cost(n) for n in lengths], dtype=np.float64)
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    loads = np.zeros(num_ranks)
    for i in np.argsort(-costs, kind="stable"):
        r = int(np.argmin(loads))
        ranks[r].append(int(i))
        loads[r] += costs[i]
    for _ in range(4 * len(lengths)):
        if not _improve_once(ranks, loads, costs):
            break
    return [sorted(r) for r in ranks]


def _improve_once(ranks: list[list[int]], loads: np.ndarray, costs: np.ndarray) -> bool:
    """Swap (or move) one row between the heaviest and lightest rank if that helps."""
    hi, lo = int(np.argmax(loads)), int(np.argmin(loads))
    gap = loads[hi] - loads[lo]
    if hi == lo or gap <= 0:
        return False
    hi_costs = costs[ranks[hi]]
    lo_costs = np.concatenate([costs[ranks[lo]], [0.0]])  # 0.0: move without a swap
    delta = hi_costs[:, None] - lo_costs[None, :]  # load that moves from hi to lo
    # the new max of the pair is max(hi - d, lo + d); it shrinks while 0 < d < gap
    new_gap = np.abs(gap - 2 * delta)
    new_gap[(delta <= 0) | (delta >= gap)] = np.inf
    a, b = np.unravel_index(int(np.argmin(new_gap)), new_gap.shape)
    if not np.isfinite(new_gap[a, b]) or new_gap[a, b] >= gap * (1 - 1e-12):
        return False
    i = ranks[hi].pop(int(a))
    ranks[lo].append(i)
    if b < len(ranks[lo]) - 1:
        j = ranks[lo].pop(int(b))
        ranks[hi].append(j)
    loads[hi] -= delta[a, b]
    loads[lo] += delta[a, b]
    return True


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int, num_ranks: int, cost: CostModel
) -> list[list[list[int]]]:
    """Rank → micro-batches → row indices, with the same micro-batch count on every rank.

    Ranks that pack into fewer micro-batches get empty ones appended: an empty
    micro-batch still runs the model (on one masked pad token) so that every collective
    is matched on every rank.
    """
    _check_lengths(lengths, max_tokens)
    plan = []
    for rank_rows in balance(lengths, num_ranks, cost):
        local = pack([lengths[i] for i in rank_rows], max_tokens)
        plan.append([[rank_rows[j] for j in mb] for mb in local])
    num_micro = max(1, max(len(p) for p in plan))
    for p in plan:
        p.extend([] for _ in range(num_micro - len(p)))
    return plan


def report(
    lengths: Sequence[int],
    plan: list[list[list[int]]],
    max_tokens: int,
    cost: CostModel,
) -> PackingReport:
    """Density and balance of a plan from ``plan_micro_batches`` (or ``[pack(...)]``)."""
    num_micro = sum(len(p) for p in plan)
    num_tokens = sum(lengths[i] for p in plan for mb in p for i in mb)
    rank_costs = [sum(cost.cost(lengths[i]) for mb in p for i in mb) for p in plan]
    mean = sum(rank_costs) / len(rank_costs) if rank_costs else 0.0
    return PackingReport(
        num_rows=sum(len(mb) for p in plan for mb in p),
        num_tokens=num_tokens,
        num_micro_batches=num_micro,
        density=num_tokens / (num_micro * max_tokens) if num_micro else 0.0,
        balance=max(rank_costs) / mean if mean > 0 else 1.0,
    )


# --------------------------------------------------------------------------- collate


class MicroBatch(msgspec.Struct, kw_only=True):
    """Rows packed into one dense row [1, T]; per-token fields are aligned to targets.

    Position t predicts ``target_ids[0, t]`` (the next token of the same row). A row's
    last token, which predicts nothing and which nothing attends to, is left out
    (:func:`dead_ends`); a shared prefix keeps its last token, which predicts nothing
    (mask 0).
    """

    input_ids: torch.Tensor
    """[1, T] int64: the rows' tokens, concatenated (each without its last token where
    :func:`dead_ends` leaves it out)."""
    position_ids: torch.Tensor
    """[1, T] int64: restart at 0 at every row (a row after a shared prefix goes on from
    the prefix's length)."""
    cu_seqlens: torch.Tensor
    """[num_segments + 1] int32: segment boundaries, for varlen attention (one segment
    per row, plus one per shared prefix)."""
    target_ids: torch.Tensor
    """[1, T] int64: the token each position predicts (0 where there is none)."""
    loss_mask: torch.Tensor
    """[1, T] float32: 1 where the target token was generated and its row is valid."""
    engine_logprobs: torch.Tensor
    """[1, T] float32: behaviour log-prob of each target under the inference engine."""
    old_logprobs: torch.Tensor
    """[1, T] float32: log-prob under the policy before this collection's first update
    (the engine's until a trainer scoring pass replaces it)."""
    advantages: torch.Tensor
    """[1, T] float32: the row's advantage on every loss-mask position, 0 elsewhere."""
    ref_logprobs: torch.Tensor | None = None
    """[1, T] float32: the reference model's log-probs, for the KL term (optional)."""
    ages: torch.Tensor | None = None
    """[1, T] int64: policy versions between each target's generating weights and the
    weights being trained (0 = on-policy; 0 where nothing is trained); None when the
    trained version was not given to ``collate``."""
    head_positions: torch.Tensor | None = None
    """[M] int64: flat indices of the positions with loss mask 1, the only ones the LM
    head computes (found on the host: on a GPU a ``nonzero`` waits for queued work)."""
    head_padding: int = 0
    """The last ``head_padding`` of ``head_positions``: positions of the padding segment
    that only round the head's row count up to a repeating shape (``collate``'s
    ``token_multiple``); the head computes them, and they read 0."""
    bounds: tuple[int, ...] = ()
    """``cu_seqlens`` as host ints: attention and the model's checks read them without
    waiting for the device."""
    prefix_of: tuple[int, ...] = ()
    """Per segment of ``bounds``: the segment it continues (a shared prompt it attends to
    first, :mod:`agentrl.shared_prefix`), -1 for none; () when no segment shares."""
    num_rows: int = 0
    num_tokens: int = 0
    """Positions with loss mask 1: this micro-batch's share of the update's token count."""

    @property
    def max_seqlen(self) -> int:
        """The longest row, a host int (the varlen kernels take it)."""
        return max((b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)),
                   default=0)

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with every tensor on ``device``, in ONE host-to-device
        copy (pinned, non-blocking on a GPU): one transfer per micro-batch, not one per
        field, and none that makes the host wait."""
        device = torch.device(device)
        names = [f for f in self.__struct_fields__
                 if isinstance(getattr(self, f), torch.Tensor)
                 and getattr(self, f).device != device]
        if not names:
            return self
        moved = copy_to_device([getattr(self, f) for f in names], device)
        return msgspec.structs.replace(self, **dict(zip(names, moved, strict=True)))


def collate(
    rows: Sequence[Row], advantages: Sequence[float], indices: Sequence[int],
    trained_version: int | None = None, share_prefixes: bool = False, token_multiple: int = 1,
) -> MicroBatch:
    """Concatenate ``rows[indices]`` into one MicroBatch (no Python loop over tokens).

    An empty ``indices`` gives a one-token micro-batch with mask 0, so a rank with
    nothing left to train still runs the same forward/backward calls as the others.
    ``trained_version``: the policy version being trained; given, the rows' version runs
    are expanded into per-target ``ages``. ``share_prefixes``: rows of one group that
    open with the same prompt hold it once (:mod:`agentrl.shared_prefix`; the model
    must attend with ``prefix_of``, which only the exact per-row attention does).
    ``token_multiple``: the token count is padded up to a multiple of it with a segment
    of masked tokens that trains nothing, so that kernels built per shape (oneDNN's, in
    bf16 on a CPU) repeat from step to step (:func:`agentrl.parallel.caches.token_multiple`).
    """
    if not indices:
        return _empty_micro_batch(trained_version)
    chosen = [rows[i] for i in indices]
    for i, r in zip(indices, chosen, strict=True):
        if not len(r.token_ids) == len(r.loss_mask) == len(r.logprobs):
            raise ValueError(
                f"row {i} ({r.rollout_id} segment {r.segment}) has {len(r.token_ids)} "
                f"token ids, {len(r.loss_mask)} loss-mask entries and {len(r.logprobs)} "
                "log-probs; the three lists must have one entry per token"
            )
    segments = pieces(chosen, share_prefixes)
    padding, head_padding = shape_padding(chosen, segments, token_multiple)
    if padding:
        segments.append(Piece(-1, 0, padding))
    lengths = torch.tensor([p.end - p.start for p in segments], dtype=torch.int64)
    # one list → tensor conversion per segment (in C); everything after is tensor ops
    source = [*chosen, padding_row(padding)]  # a padding segment names row -1
    ids = torch.cat([torch.tensor(source[p.row].token_ids[p.start:p.end], dtype=torch.int64)
                     for p in segments])
    mask = torch.cat([torch.tensor(source[p.row].loss_mask[p.start:p.end],
                                   dtype=torch.float32) for p in segments])
    logprobs = torch.cat([torch.tensor(source[p.row].logprobs[p.start:p.end],
                                       dtype=torch.float32) for p in segments])
    valid = torch.tensor([float(source[p.row].valid) for p in segments])
    adv = torch.tensor([float(advantages[indices[p.row]]) if p.row >= 0 else 0.0
                        for p in segments], dtype=torch.float32)
    starts = torch.tensor([p.start for p in segments], dtype=torch.int64)
    total = int(lengths.sum())
    cu = torch.zeros(len(segments) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0).to(torch.int32)
    row_of = torch.repeat_interleave(torch.arange(len(segments)), lengths)
    positions = torch.arange(total) - (cu[:-1].to(torch.int64) - starts)[row_of]
    # shift left by one: position t predicts token t+1; a segment's last position has
    # none (a shared prefix's last token predicts nothing trained: see shared_prefix)
    is_last = torch.zeros(total, dtype=torch.bool)
    is_last[cu[1:].to(torch.int64) - 1] = True
    targets = torch.roll(ids, -1).masked_fill(is_last, 0)
    target_mask = torch.roll(mask, -1).masked_fill(is_last, 0.0) * valid[row_of]
    target_logprobs = torch.roll(logprobs, -1).masked_fill(is_last, 0.0) * target_mask
    per_token = {"ids": ids, "positions": positions, "targets": targets,
                 "mask": target_mask, "logprobs": target_logprobs,
                 "advantages": adv[row_of] * target_mask}
    if trained_version is not None:
        versions = torch.cat([token_versions(source[p.row].version_runs,
                                             len(source[p.row].token_ids),
                                             trained_version)[p.start:p.end]
                              for p in segments])
        per_token["ages"] = (trained_version - torch.roll(versions, -1)) * target_mask.long()
    # the tokens that do no work leave: they read nothing another position uses
    dead = torch.tensor(dead_ends(segments), dtype=torch.bool)
    alive = torch.ones(total, dtype=torch.bool)
    alive[cu[1:].to(torch.int64)[dead] - 1] = False
    kept = {name: tensor[alive] for name, tensor in per_token.items()}
    lengths -= dead.long()
    total = int(lengths.sum())
    cu[1:] = torch.cumsum(lengths, 0).to(torch.int32)
    prefix_of = tuple(p.prefix for p in segments)
    return MicroBatch(
        input_ids=kept["ids"][None],
        position_ids=kept["positions"][None],
        cu_seqlens=cu,
        target_ids=kept["targets"][None],
        loss_mask=kept["mask"][None],
        engine_logprobs=kept["logprobs"][None],
        old_logprobs=kept["logprobs"][None].clone(),
        advantages=kept["advantages"][None],
        ages=kept["ages"][None] if "ages" in kept else None,
        head_positions=torch.cat([kept["mask"].nonzero().squeeze(-1),
                                  torch.arange(total - padding, total - padding + head_padding)]),
        head_padding=head_padding,
        bounds=tuple(cu.tolist()),
        prefix_of=prefix_of if any(p >= 0 for p in prefix_of) else (),
        num_rows=len(chosen),
        num_tokens=int(kept["mask"].sum()),
    )


def _empty_micro_batch(trained_version: int | None = None) -> MicroBatch:
    zeros_f = torch.zeros(1, 1)
    zeros_i = torch.zeros(1, 1, dtype=torch.int64)
    return MicroBatch(
        input_ids=zeros_i,
        position_ids=zeros_i.clone(),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        target_ids=zeros_i.clone(),
        loss_mask=zeros_f,
        engine_logprobs=zeros_f.clone(),
        old_logprobs=zeros_f.clone(),
        advantages=zeros_f.clone(),
        ages=None if trained_version is None else zeros_i.clone(),
        head_positions=torch.zeros(0, dtype=torch.int64),
        bounds=(0, 1),
        num_rows=0,
        num_tokens=0,
    )

"""A slot-based key/value cache for the PyTorch inference engine.

Each concurrent request owns one *slot*: a stretch of positions in every layer's key and
value tensors, laid out ``[num_slots, kv_heads, capacity, head_dim]`` so that the keys of
a run of slots up to some length are a view (attention reads them in place, no gather).
``lengths[slot]`` counts the tokens cached there.

The cache holds ``capacity`` positions per slot and grows (doubling, by whole blocks) up
to ``max_len`` when a request needs more: it is sized to what the scheduled requests can
reach, never to the model's maximum positions unless a request does. Growing copies the
filled part once.

The cache also records which slots hold copies of one another's first positions
(:meth:`KVCache.copy_prefix`: a group's samples of one prompt), so that batched decoding
can read a shared prompt once per group instead of once per slot
(:mod:`agentrl.model.cascade`).
"""

from __future__ import annotations

import torch

GROWTH_BLOCK = 64
"""Positions are allocated in multiples of this."""


def kv_cache_bytes(num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                   head_dim: int, itemsize: int) -> int:
    """Bytes a :class:`KVCache` of these dimensions holds at most (keys and values, every
    layer, ``max_len`` positions per slot)."""
    return 2 * num_layers * num_slots * max_len * num_kv_heads * head_dim * itemsize


def cache_dtype(compute: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype a model computing in ``compute`` on ``device`` caches keys and values in:
    float32 for bf16/fp16 on a CPU, where one-query attention over a bf16 cache runs 1.5
    to 4x slower than over a float32 one twice its size (128 rows, 84 to 1,024 keys,
    2 threads); the dtype itself elsewhere."""
    low = compute in (torch.bfloat16, torch.float16)
    return torch.float32 if low and torch.device(device).type == "cpu" else compute


Slots = torch.Tensor | range
"""Which slots a forward touches: a tensor of slot ids, or a ``range`` (read as a view)."""


class KVCache:
    """Keys and values of every layer, per slot: [num_slots, kv_heads, capacity, head_dim]."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        capacity: int | None = None,
    ) -> None:
        """``capacity``: positions allocated now (default ``max_len``); the cache grows
        toward ``max_len`` on demand (:meth:`ensure_capacity`)."""
        if num_slots < 1 or max_len < 1:
            raise ValueError(
                f"a KV cache needs num_slots >= 1 and max_len >= 1, got {num_slots}, {max_len}"
            )
        self.num_layers, self.num_slots, self.max_len = num_layers, num_slots, max_len
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.prefix_group = [-1] * num_slots
        """Per slot, the group of slots whose first positions it holds a copy of (-1:
        none); every member's first ``prefix_len[slot]`` positions equal the group's
        first holder's at the time the group was made."""
        self.prefix_len = [0] * num_slots
        """Per slot, how many of its first positions are that copy (never more than its
        length: later tokens are written after it)."""
        self._groups_made = 0
        self.ensure_capacity(min(capacity or max_len, max_len))

    def position_bytes(self) -> int:
        """Bytes one position of one slot takes in one layer (its keys and values)."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes allocated now (keys and values, every layer)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def ensure_capacity(self, positions: int) -> None:
        """Make room for ``positions`` tokens per slot (at most ``max_len``): reallocate to
        the larger of that and twice the current capacity, keeping what is cached."""
        if positions <= self.capacity:
            return
        if positions > self.max_len:
            raise ValueError(f"a KV cache slot cannot hold {positions} tokens: max_len is "
                             f"{self.max_len}")
        target = max(positions, 2 * self.capacity)
        target = min(self.max_len, -(-target // GROWTH_BLOCK) * GROWTH_BLOCK)
        shape = (self.num_slots, self.num_kv_heads, target, self.head_dim)
        old = self.capacity
        for store in (self.keys, self.values):
            for layer in range(self.num_layers):
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if old:
                    grown[:, :, :old] = store[layer]
                if layer < len(store):
                    store[layer] = grown
                else:
                    store.append(grown)
        self.capacity = target

    def reset(self, slot: int) -> None:
        """Free a slot for a new request (its old entries are simply overwritten later)."""
        self.set_length(slot, 0)

    def set_length(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached positions of ``slot`` (a conversation
        continued from its own cache, or 0 for a new request); what follows is
        overwritten by the next tokens, so its record of a shared copy shrinks with it."""
        self.lengths[slot] = length
        self.prefix_len[slot] = min(self.prefix_len[slot], length)
        if self.prefix_len[slot] == 0:
            self.prefix_group[slot] = -1

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Give slot ``target`` the first ``length`` cached positions of ``source`` (a
        shared prompt, or a request moved to another slot); its length becomes ``length``.
        The two are recorded as holding the same first positions."""
        if source != target:
            for store in (self.keys, self.values):
                for layer in store:
                    layer[target, :, :length] = layer[source, :, :length]
            if self.prefix_group[source] < 0 and length > 0:
                self.prefix_group[source] = self._groups_made
                self.prefix_len[source] = length
                self._groups_made += 1
            self.prefix_group[target] = self.prefix_group[source]
            self.prefix_len[target] = min(length, self.prefix_len[source])
        self.set_length(target, length)

    def positions_for(self, slots: Slots, num_new: int | torch.Tensor) -> torch.Tensor:
        """Positions [N, T] the next tokens of each slot take (T = ``num_new`` when an int,
        else ``num_new`` [N] real tokens per row, T their maximum); checks room and grows
        the cache when a row needs more positions than it holds."""
        ids = slot_ids(slots, self.lengths.device)
        if isinstance(slots, torch.Tensor) and ids.numel() != len(set(ids.tolist())):
            raise ValueError(f"forward_cached got slot ids {ids.tolist()}; each slot once")
        start = self.lengths[ids]
        counts = num_new if isinstance(num_new, torch.Tensor) else torch.full_like(
            start, num_new)
        end = start + counts
        longest = int(end.max()) if end.numel() else 0
        if longest > self.max_len:
            row = int((end > self.max_len).nonzero()[0, 0])
            slot = int(ids[row])
            raise ValueError(
                f"KV cache slot {slot} holds {int(self.lengths[slot])} tokens; adding "
                f"{int(counts[row])} would pass max_len={self.max_len}. Create the cache with "
                "a larger max_len or end the request before it outgrows it."
            )
        self.ensure_capacity(longest)
        width = num_new if isinstance(num_new, int) else int(counts.max()) if counts.numel() else 0
        return start[:, None] + torch.arange(width, device=start.device)

    def write(
        self,
        layer: int,
        slots: Slots,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        span: int,
        valid: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [N, T, KVH, D] at positions [N, T] (only where ``valid`` [N, T], when
        given); return the slots' keys/values over ``span`` positions as [N, KVH, S, D]
        (a view of the cache for a ``range`` of slots)."""
        ids = slot_ids(slots, positions.device)
        rows = ids[:, None].expand_as(positions)
        keys, values = self.keys[layer], self.values[layer]
        k, v = k.to(keys.dtype), v.to(values.dtype)
        if valid is not None:
            rows, positions, k, v = rows[valid], positions[valid], k[valid], v[valid]
        keys[rows, :, positions] = k
        values[rows, :, positions] = v
        if isinstance(slots, range):
            return (keys[slots.start:slots.stop, :, :span],
                    values[slots.start:slots.stop, :, :span])
        return keys[ids, :, :span], values[ids, :, :span]


def slot_ids(slots: Slots, device: torch.device | str) -> torch.Tensor:
    """The slot ids of ``slots`` as a long tensor on ``device``."""
    if isinstance(slots, range):
        return torch.arange(slots.start, slots.stop, device=device)
    return slots.to(device=device, dtype=torch.long)

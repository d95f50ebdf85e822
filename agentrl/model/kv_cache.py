"""A slot-based key/value cache for the PyTorch inference engine.

Each concurrent request owns one *slot*: a fixed stretch of ``max_len`` positions in
every layer's key and value tensors. ``lengths[slot]`` counts the tokens cached there.
"""

from __future__ import annotations

import torch


def kv_cache_bytes(num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                   head_dim: int, itemsize: int) -> int:
    """Bytes a :class:`KVCache` of these dimensions holds (keys and values, every layer)."""
    return 2 * num_layers * num_slots * max_len * num_kv_heads * head_dim * itemsize


class KVCache:
    """Keys and values of every layer, per slot: [num_slots, max_len, kv_heads, head_dim]."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots < 1 or max_len < 1:
            raise ValueError(
                f"a KV cache needs num_slots >= 1 and max_len >= 1, got {num_slots}, {max_len}"
            )
        shape = (num_slots, max_len, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.max_len = max_len
        self.num_slots = num_slots

    def reset(self, slot: int) -> None:
        """Free a slot for a new request (its old entries are simply overwritten later)."""
        self.lengths[slot] = 0

    def positions_for(self, slots: torch.Tensor, num_new: int) -> torch.Tensor:
        """Positions [N, T] the next ``num_new`` tokens of each slot will take; checks room."""
        if slots.numel() != len(set(slots.tolist())):
            raise ValueError(f"forward_cached got slot ids {slots.tolist()}; each slot once")
        start = self.lengths[slots]
        over = start + num_new > self.max_len
        if bool(over.any()):
            slot = int(slots[over.nonzero()[0, 0]])
            raise ValueError(
                f"KV cache slot {slot} holds {int(self.lengths[slot])} tokens; adding "
                f"{num_new} would pass max_len={self.max_len}. Create the cache with a larger "
                "max_len or end the request before it outgrows it."
            )
        return start[:, None] + torch.arange(num_new, device=slots.device)

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        span: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [N, T, KVH, D] at positions; return the slots' keys/values up to
        ``span`` (default: the longest new length), as [N, KVH, S, D] for attention."""
        rows = slots[:, None].expand_as(positions)
        self.keys[layer][rows, positions] = k.to(self.keys[layer].dtype)
        self.values[layer][rows, positions] = v.to(self.values[layer].dtype)
        span = span or int(positions.max()) + 1
        keys = self.keys[layer][slots, :span].transpose(1, 2)
        values = self.values[layer][slots, :span].transpose(1, 2)
        return keys, values

"""Small stand-ins for the pieces other modules provide: a tiny KV-cached model, a
character tokenizer with a ChatML template, scripted engines and environments.

The tiny model follows the agreed interface (``forward``, ``new_kv_cache``,
``forward_cached``) with a real key/value cache, so engine tests exercise real caching.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import torch
from torch import nn

from agentrl.rollout.engine import Generation, SamplingParams

# ----------------------------------------------------------------------------- tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class CharTokenizer:
    """Ids 0-2 are the special tokens; then one id per byte value (vocab 259)."""

    eos_token_id = 2  # <|im_end|>, as in Qwen instruct checkpoints
    vocab_size = 3 + 256

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for k, special in enumerate(SPECIALS):
                if text.startswith(special, i):
                    ids.append(k)
                    i += len(special)
                    break
            else:
                ids.extend(3 + b for b in text[i].encode())
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        out, buf = [], bytearray()
        for t in ids:
            if t < 3:
                out.append(buf.decode(errors="replace"))
                buf = bytearray()
                out.append(SPECIALS[t])
            else:
                buf.append(t - 3)
        out.append(buf.decode(errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        text = ""
        if tools:
            text += f"<|im_start|>system\ntools: {[t['name'] for t in tools]}<|im_end|>\n"
        for m in messages:
            text += f"<|im_start|>{m['role']}\n{m.get('content', '')}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return text


# ----------------------------------------------------------------------------- model


class KVCache:
    def __init__(self, layers: int, slots: int, max_len: int, dim: int) -> None:
        self.k = torch.zeros(layers, slots, max_len, dim)
        self.v = torch.zeros(layers, slots, max_len, dim)
        self.lengths = torch.zeros(slots, dtype=torch.long)


class TinyLM(nn.Module):
    """Two single-head attention + MLP blocks with learned positions."""

    def __init__(self, vocab: int = CharTokenizer.vocab_size, dim: int = 32, layers: int = 2,
                 max_pos: int = 512, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.dim = dim
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_pos, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)
        with torch.no_grad():
            self.head.weight.mul_(8.0)  # peaked distributions: sampled text is not uniform

    def forward(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        """Full causal forward, logits [B, T, V]."""
        t = input_ids.shape[1]
        x = self.embed(input_ids) + self.pos(torch.arange(t))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        for qkv, mlp in zip(self.qkv, self.mlp, strict=True):
            q, k, v = qkv(x).chunk(3, dim=-1)
            x = x + self._attend(q, k, v, mask)
            x = x + torch.tanh(mlp(x))
        return self.head(x)

    def _attend(self, q, k, v, mask):
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dim)
        return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1) @ v

    def new_kv_cache(self, num_slots: int, max_len: int) -> KVCache:
        return KVCache(len(self.qkv), num_slots, max_len, self.dim)

    def forward_cached(self, input_ids, slots, cache: KVCache) -> torch.Tensor:
        n, t = input_ids.shape
        start = cache.lengths[slots]  # [N]
        positions = start[:, None] + torch.arange(t)[None]  # [N, T]
        x = self.embed(input_ids) + self.pos(positions)
        total = int(start.max()) + t
        key_pos = torch.arange(total)[None, None, :]
        mask = key_pos <= positions[:, :, None]  # [N, T, total]
        for layer, (qkv, mlp) in enumerate(zip(self.qkv, self.mlp, strict=True)):
            q, k, v = qkv(x).chunk(3, dim=-1)
            for i in range(n):
                s, b = int(slots[i]), int(start[i])
                cache.k[layer, s, b:b + t] = k[i]
                cache.v[layer, s, b:b + t] = v[i]
            ks, vs = cache.k[layer, slots, :total], cache.v[layer, slots, :total]
            x = x + self._attend(q, ks, vs, mask)
            x = x + torch.tanh(mlp(x))
        cache.lengths[slots] += t
        return self.head(x)


# ----------------------------------------------------------------------------- engines


class ScriptedEngine:
    """Returns canned replies (token ids) in order, per prompt prefix-independent."""

    def __init__(self, tokenizer: CharTokenizer, replies: list[str], end: bool = True) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.end = end
        self.calls: list[list[int]] = []
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0)
        self.calls.append(list(prompt_ids))
        text = self.replies[(len(self.calls) - 1) % len(self.replies)]
        ids = self.tokenizer.encode(text)[: params.max_tokens]
        if self.end and len(ids) < params.max_tokens:
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop" if ids and ids[-1] in params.stop_token_ids else "length"
        gen = Generation(ids, [-0.5] * len(ids), reason)
        self.generations.append(gen)
        return gen

    def update_weights(self, state_dict: dict) -> None:
        pass


class RecordingEngine:
    """Wraps an engine and records every prompt it received and what it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.prompts.append(list(prompt_ids))
        gen = await self.inner.generate(prompt_ids, params)
        self.generations.append(gen)
        return gen

    def update_weights(self, state_dict: dict) -> None:
        self.inner.update_weights(state_dict)

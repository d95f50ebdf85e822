"""Tiny checkpoints built locally, so tests and smoke runs need no download.

``build_tiny_checkpoint`` writes a complete Hugging Face folder (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) that our loader, transformers
and vLLM all read. The tokenizer is a byte-level BPE trained on a small built-in corpus:
any text encodes, nothing maps to an unknown token.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec
import torch
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from agentrl.model.args import ModelArgs
from agentrl.model.chat_template import CHAT_TEMPLATES
from agentrl.model.checkpoint import DTYPE_NAMES, save_pretrained
from agentrl.model.model import CausalLM
from agentrl.model.tokenizer import Tokenizer as ChatTokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
FIT_PRETOKENIZE_REGEX = QWEN2_PRETOKENIZE_REGEX.replace(
    r"[^\r\n\p{L}\p{N}]?\p{L}+", r"[^\S\r\n]?\p{L}+|[^\s\p{L}\p{N}](?=\p{L})")
"""The pre-tokenizer the merges are fitted with: Qwen2's, except that a punctuation mark
never joins the word after it (a space still does). Qwen2's own pipeline then splits
``<answer>owl`` into ``<``, ``answer``, ``>`` and the very ``owl`` of a page's line, where merges
fitted on it would make ``>owl`` a token of its own: a third form of the name that a small
model must learn to pair with ``owl`` and `` owl`` before it can copy a fact into an
answer."""
TINY_MAX_POSITIONS = 4096
"""max_position_embeddings of the tiny built-in checkpoints (the default of
``build_tiny_checkpoint``)."""
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS) + 1  # bytes + added + one merge


class TokenizerLayout(msgspec.Struct, frozen=True):
    """A model family's tokenizer conventions for a tiny checkpoint: its special tokens
    (control tokens, skipped by ``skip_special_tokens``), its added ones (markup that
    survives it), which are BOS / EOS / PAD, and its chat template. The default is
    Qwen2.5's with the named template of ``CHAT_TEMPLATES``."""

    chat_template: str = "qwen2.5"
    """A name of ``CHAT_TEMPLATES``, or a Jinja template's text."""
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS
    added_tokens: tuple[str, ...] = TOOL_TOKENS
    eos_token: str = "<|im_end|>"
    pad_token: str = "<|endoftext|>"
    bos_token: str | None = None
    """Written into tokenizer_config.json (templates render it); None: no BOS."""

    def template_text(self) -> str:
        """The chat template's Jinja text."""
        if self.chat_template in CHAT_TEMPLATES:
            return CHAT_TEMPLATES[self.chat_template]
        if "{" not in self.chat_template:
            raise ValueError(f"chat template {self.chat_template!r}: choose one of "
                             f"{sorted(CHAT_TEMPLATES)} or give a template's text")
        return self.chat_template

WORDS = (
    "the a an and or not is are was be to of in on at for with from by it this that you "
    "we they he she answer question number sum total add subtract multiply divide equals "
    "result tool call search find read write file list step plan done yes no true false "
    "hello world good task goal reward score game move left right up down start end "
    "first second third next last think because so then if else when while count"
).split()


def default_corpus(seed: int = 0, num_lines: int = 600) -> list[str]:
    """Built-in text: digits, arithmetic, English words and chat/tool markup."""
    rng = random.Random(seed)
    lines = [" ".join(str(i) for i in range(100))]
    for _ in range(num_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        op, val = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        lines.append(f"{a} {op} {b} = {val}")
        lines.append(words.capitalize() + rng.choice([".", "?", "!", ","]))
        lines.append(
            f"<|im_start|>user\nWhat is {a} {op} {b}?<|im_end|>\n"
            f"<|im_start|>assistant\n<tool_call>\n"
            f'{{"name": "calculator", "arguments": {{"expression": "{a} {op} {b}"}}}}\n'
            f"</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{val}\n"
            f"</tool_response><|im_end|>\n<|im_start|>assistant\nThe answer is {val}.<|im_end|>"
        )
    return lines


def build_tokenizer(corpus: Iterable[str], vocab_size: int,
                    layout: TokenizerLayout | None = None) -> Tokenizer:
    """A byte-level BPE trained on corpus; vocab_size counts the added tokens too.

    The layout's special tokens (Qwen's: <|endoftext|>, <|im_start|>, <|im_end|>) and its
    added markup tokens (not special: they survive skip_special_tokens) take the last ids.
    """
    layout = layout or TokenizerLayout()
    num_added = len(layout.special_tokens) + len(layout.added_tokens)
    if vocab_size < 256 + num_added + 1:
        raise ValueError(f"vocab_size {vocab_size} is too small; a byte-level BPE with "
                         f"{num_added} added tokens needs >= {256 + num_added + 1}")
    tok = Tokenizer(models.BPE())
    # Qwen2's pipeline exactly: transformers' Qwen2Tokenizer rebuilds it from the vocab, so
    # any other pipeline would tokenize differently there (and in vLLM) than here.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _byte_level_split(FIT_PRETOKENIZE_REGEX)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - num_added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    tok.pre_tokenizer = _byte_level_split(QWEN2_PRETOKENIZE_REGEX)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in layout.special_tokens])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in layout.added_tokens])
    return tok


def _byte_level_split(regex: str) -> pre_tokenizers.PreTokenizer:
    """Split by ``regex``, then map bytes to BPE's printable alphabet."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def tokenizer_config(tok: Tokenizer, max_length: int, chat_template: str = "qwen2.5",
                     layout: TokenizerLayout | None = None) -> dict:
    """tokenizer_config.json for a tiny tokenizer: the layout's conventions (default
    Qwen2.5's: eos = <|im_end|>, with the named template of ``CHAT_TEMPLATES``)."""
    layout = layout or TokenizerLayout(chat_template)
    template = layout.template_text()
    decoder = {}
    for token in (*layout.special_tokens, *layout.added_tokens):
        decoder[str(tok.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in layout.special_tokens,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": layout.bos_token,
        "eos_token": layout.eos_token,
        "pad_token": layout.pad_token,
        "unk_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def tiny_tokenizer(seed: int = 0, vocab_size: int = 512, corpus: Iterable[str] | None = None,
                   max_position_embeddings: int = 4096, chat_template: str = "qwen2.5",
                   layout: TokenizerLayout | None = None) -> ChatTokenizer:
    """The tokenizer (with its chat template) that ``build_tiny_checkpoint`` writes for the
    same arguments, without writing anything: what ``agentrl plan`` measures prompts with
    when ``model.path`` is empty."""
    layout = layout or TokenizerLayout(chat_template)
    raw = build_tokenizer(corpus if corpus is not None else default_corpus(seed), vocab_size,
                          layout)
    return ChatTokenizer(raw, tokenizer_config(raw, max_position_embeddings, layout=layout))


def build_tiny_checkpoint(
    path: str | Path,
    family: Literal["qwen2", "qwen3", "llama"] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 512,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
    max_position_embeddings: int = TINY_MAX_POSITIONS,
    chat_template: str = "qwen2.5",
    layout: TokenizerLayout | None = None,
) -> Path:
    """Write a randomly initialised HF checkpoint folder; deterministic given the arguments
    (``chat_template``: a name of ``agentrl.model.chat_template.CHAT_TEMPLATES``;
    ``layout``: another family's tokens and template instead)."""
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size {hidden_size} must divide by num_heads {num_heads}, and num_heads "
            f"by num_kv_heads {num_kv_heads}"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    layout = layout or TokenizerLayout(chat_template)
    tokenizer = tiny_tokenizer(seed, vocab_size, corpus, max_position_embeddings, layout=layout)
    tok = tokenizer.raw
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer.config, indent=2))
    args = ModelArgs(
        model_type=family,
        vocab_size=max(vocab_size, tok.get_vocab_size()),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        rope_theta=500000.0 if family == "llama" else 1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        attention_bias=family == "qwen2",
        qk_norm=family == "qwen3",
        bos_token_id=tok.token_to_id(layout.bos_token or layout.pad_token),
        eos_token_id=tok.token_to_id(layout.eos_token),
        max_position_embeddings=max_position_embeddings,
    )
    save_pretrained(init_model(args, seed).to(dtype), path)
    (path / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": args.bos_token_id,
                "eos_token_id": args.eos_token_id,
                "torch_dtype": DTYPE_NAMES[dtype],
            },
            indent=2,
        )
    )
    return path


def init_model(args: ModelArgs, seed: int) -> CausalLM:
    """A CausalLM with GPT-style init (normal 0.02, zero biases, unit norms)."""
    generator = torch.Generator().manual_seed(seed)
    model = CausalLM(args, attention="torch")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:  # biases random too, so tests see them matter
                param.normal_(0.0, 0.02, generator=generator)
    return model

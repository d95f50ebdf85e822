"""The model shapes the speed benches compare at: the quickstart warm start and a random
8-layer, 512-hidden decoder with the same tokenizer (issue 25's "larger shape"); and one
timed collection of grouped requests through an engine, as the engine benches run it."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "assets" / "calc-countdown-sft"
LARGE = {"vocab_size": 1024, "hidden_size": 512, "intermediate_size": 1536,
         "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def large_model(seed: int = 0) -> Any:
    """A randomly initialized LARGE decoder (agentrl's ``CausalLM``, float32) with the small
    warm start's vocabulary and positions."""
    from agentrl.model.args import read_args
    from agentrl.model.tiny import init_model

    return init_model(msgspec.structs.replace(read_args(SMALL), **LARGE), seed=seed)


def time_collection(engine: Any, prompts: list[list[int]], samples: int,
                    params: Callable[[int], Any]) -> tuple[float, list]:
    """Seconds for ``engine`` to generate ``samples`` completions of every prompt, requests
    arriving groups interleaved (request i: prompt i mod len(prompts), ``params(i)``), and
    the generations in request order."""
    count = len(prompts) * samples

    async def together() -> list:
        return await asyncio.gather(*(engine.generate(prompts[i % len(prompts)], params(i))
                                      for i in range(count)))

    start = time.perf_counter()
    generations = asyncio.run(together())
    return time.perf_counter() - start, generations


def write_large_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A randomly initialized LARGE decoder as a HF folder (transformers, vLLM and agentrl
    load it) with the small warm start's tokenizer, special tokens and positions, so every
    framework sees the same vocabulary and stops on the same EOS."""
    from agentrl.model.checkpoint import save_pretrained

    path = save_pretrained(large_model(seed), folder)
    for name in TOKENIZER_FILES:
        shutil.copy(SMALL / name, path / name)
    return path

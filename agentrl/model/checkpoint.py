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

from agentrl.model.args import ModelArgs, args_to_hf, read_args
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
    state = {k: v.to(dtype) for k, v in read_checkpoint_state(path, args).items()}
    model.load_state_dict(state, assign=True, strict=False)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # inv_freq was built on the meta device: rebuild it for real.
    model.inv_freq = fresh_inv_freq(args)
    return model.to(device)


def read_checkpoint_state(path: Path, args: ModelArgs) -> dict[str, torch.Tensor]:
    """The folder's tensors, checked against the parameters ``args`` describes (a tied
    model's stored ``lm_head.weight`` is dropped: the head is the embedding)."""
    state = read_safetensors(path)
    if args.tie_word_embeddings:
        state.pop(LM_HEAD, None)
    with torch.device("meta"):
        names = CausalLM(args, attention="torch").state_dict().keys()
    expected = {k for k in names if not (args.tie_word_embeddings and k == LM_HEAD)}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    unexpected = {k for k in unexpected if not k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match config.json; missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}. Is config.json from the same checkpoint?"
        )
    return {k: state[k] for k in expected}


def fresh_inv_freq(args: ModelArgs) -> torch.Tensor:
    """RoPE inverse frequencies in fp32 (a buffer that is never saved, always rebuilt)."""
    from agentrl.model.rope import inverse_frequencies

    inv_freq, _ = inverse_frequencies(
        args.head_dim, args.rope_theta, args.rope_scaling, args.max_position_embeddings
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
    dtype_name = DTYPE_NAMES.get(model.dtype, "float32")
    return save_state_dict(model.config, model.state_dict(), path, dtype_name)


def save_state_dict(args: ModelArgs, state: dict[str, torch.Tensor], path: str | Path,
                    dtype_name: str = "float32") -> Path:
    """Write a full state dict as a HF folder (config.json + model.safetensors); a tied
    head is stored once, as HF does."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(args_to_hf(args, dtype_name), indent=2))
    tensors = {
        k: v.detach().to("cpu").contiguous()
        for k, v in state.items()
        if not (args.tie_word_embeddings and k == LM_HEAD)
    }
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path

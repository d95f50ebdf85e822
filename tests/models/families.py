"""The model families agentrl supports, as tiny checkpoints: tiny random weights of an
architecture agentrl runs, with that family's tokenizer layout (special tokens, BOS /
EOS / PAD) and its real chat template (``tests/models/templates/``, each naming its
source; Qwen2.5's is ``agentrl.model.chat_template``'s)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agentrl.envs import AgentEnv
from agentrl.envs.parsers.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from agentrl.envs.tools import tool
from agentrl.model import build_tiny_checkpoint
from agentrl.model.tiny import SPECIAL_TOKENS, TOOL_TOKENS, TokenizerLayout

TEMPLATES = Path(__file__).parent / "templates"


def _ds(name: str) -> str:
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


class Family(msgspec.Struct, frozen=True):
    """One family: its tiny checkpoint's layout, architecture and tool-call format."""

    layout: TokenizerLayout
    architecture: str
    tool_format: str


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family(TokenizerLayout(), "qwen2", "hermes"),
    "qwen3": Family(TokenizerLayout(_template("qwen3"),
                                    added_tokens=(*TOOL_TOKENS, "<think>", "</think>")),
                    "qwen3", "hermes"),
    "llama3.1": Family(TokenizerLayout(
        _template("llama3.1"),
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                        "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                        "<|finetune_right_pad_id|>"),
        added_tokens=(), eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>"), "llama", "llama3_json"),
    "mistral": Family(TokenizerLayout(
        _template("mistral"),
        special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                        "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                        "[/TOOL_RESULTS]"),
        added_tokens=(), eos_token="</s>", pad_token="<unk>", bos_token="<s>"),
        "llama", "mistral"),
    "gpt-oss": Family(TokenizerLayout(
        _template("gpt_oss"),
        special_tokens=("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>",
                        "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                        "<|call|>"),
        added_tokens=(), eos_token="<|return|>", pad_token="<|endoftext|>",
        bos_token="<|startoftext|>"), "llama", "harmony"),
    "deepseek-v3": Family(TokenizerLayout(
        _template("deepseek_v3"),
        special_tokens=(_ds("begin of sentence"), _ds("end of sentence"), _ds("User"),
                        _ds("Assistant"), CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP,
                        _ds("tool outputs begin"), _ds("tool outputs end"),
                        _ds("tool output begin"), _ds("tool output end"), _ds(" pad ")),
        added_tokens=(), eos_token=_ds("end of sentence"), pad_token=_ds(" pad "),
        bos_token=_ds("begin of sentence")), "llama", "deepseek_v3"),
}
"""Every supported family by name."""

assert set(SPECIAL_TOKENS) <= set(FAMILIES["qwen3"].layout.special_tokens)


def build_family_checkpoint(path: Path, name: str) -> Path:
    """A tiny checkpoint of ``name``'s family (hidden 32, 2 layers, vocabulary 420)."""
    family = FAMILIES[name]
    return build_tiny_checkpoint(path, family=family.architecture, hidden_size=32,
                                 num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=420,
                                 layout=family.layout)


class AddToolEnv(AgentEnv):
    """The test environments' one tool, ``add(a, b)``: integer arguments exercise every
    family's argument encoding; subclasses give the task, turns and grade."""

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

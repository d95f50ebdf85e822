"""agentrl's tool-call parsers read the calls vLLM's own tool parsers read, on the shared
corpus of model texts (``tests/models/tool_call_corpus.py``), valid and malformed.

Each format runs against vLLM's parser of the same name (``hermes``, ``qwen3_coder``,
``llama3_json``, ``mistral``, ``deepseek_v3``) with the tokenizer of that family's tiny
checkpoint (vLLM's parsers look their markup tokens up in the vocabulary). On a valid text
both read the same calls; on a malformed one agentrl reads no call vLLM does not, and
reports the error (vLLM may be more lenient: it can read a call from an unclosed block).
gpt-oss's harmony format is left out: vLLM's ``openai`` parser reads token ids through
openai_harmony's own o200k vocabulary, which a tiny checkpoint does not have and nothing
may download here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from agentrl.engines.vllm_setup import vllm_available
from agentrl.envs.parsers import make_parser
from agentrl.envs.tools import ToolCall, ToolCallError
from tests.models.families import build_family_checkpoint
from tests.models.tool_call_corpus import CORPUS, SCHEMAS

pytestmark = pytest.mark.vllm

FAMILY_OF = {"hermes": "qwen2.5", "qwen3_coder": "qwen2.5", "llama3_json": "llama3.1",
             "mistral": "mistral", "deepseek_v3": "deepseek-v3"}
"""The tiny checkpoint whose tokenizer each vLLM parser is built with."""
CASES = [(fmt, text, calls, errors) for fmt in FAMILY_OF
         for text, calls, errors in CORPUS[fmt]]


def _first(*names: str) -> object:
    """The first of ``module:attribute`` that imports (vLLM moved these between
    releases)."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {names} imports in this vLLM")


def vllm_parser(fmt: str, folder: Path) -> object:
    """vLLM's tool parser of this name, on the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    manager = _first("vllm.tool_parsers:ToolParserManager",
                     "vllm.entrypoints.openai.tool_parsers:ToolParserManager")
    return manager.get_tool_parser(fmt)(AutoTokenizer.from_pretrained(folder))


def request() -> object:
    """A chat request offering the corpus's tools (qwen3_coder types values by them)."""
    request_class = _first("vllm.entrypoints.openai.chat_completion.protocol:"
                           "ChatCompletionRequest",
                           "vllm.entrypoints.openai.protocol:ChatCompletionRequest")
    tools = [{"type": "function", "function": {"name": name, "parameters": schema}}
             for name, schema in SCHEMAS.items()]
    return request_class(model="tiny", messages=[{"role": "user", "content": "go"}],
                         tools=tools)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not vllm_available():
        pytest.skip("vllm is optional and not installed: run .ci/vllm for these tests")
    root = tmp_path_factory.mktemp("parser_families")
    return {name: build_family_checkpoint(root / name, name)
            for name in sorted(set(FAMILY_OF.values()))}


@pytest.mark.parametrize(("fmt", "text", "calls", "errors"), CASES)
def test_agentrl_reads_the_calls_vllm_reads(folders, fmt, text, calls, errors):
    extracted = vllm_parser(fmt, folders[FAMILY_OF[fmt]]).extract_tool_calls(text, request())
    theirs = [(c.function.name, json.loads(c.function.arguments))
              for c in (extracted.tool_calls if extracted.tools_called else [])]
    parsed = make_parser(fmt, SCHEMAS).parse(text)
    ours = [(c.name, c.arguments) for c in parsed if isinstance(c, ToolCall)]
    assert ours == calls  # the corpus's own expectation, as in tests/models
    if errors:
        assert any(isinstance(c, ToolCallError) for c in parsed)
        assert theirs[:len(ours)] == ours  # nothing read that vLLM does not read
    else:
        assert theirs == ours

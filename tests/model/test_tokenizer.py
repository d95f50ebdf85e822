"""Tokenizer and chat template against transformers' AutoTokenizer on the same folder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.model import build_tiny_checkpoint, load_tokenizer
from agentrl.model.tiny import SPECIAL_TOKENS, TOOL_TOKENS
from agentrl.types import Message

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate <arithmetic> & return it",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 2+2"}},
                "required": ["expression"],
            },
        },
    }
]

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is 2 + 2?"}],
    "with_system": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ],
    "tool_round_trip": [
        {"role": "user", "content": "What is 12 * 7?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "12 * 7"}},
                }
            ],
        },
        {"role": "tool", "name": "calculator", "content": "84"},
        {"role": "tool", "name": "calculator", "content": "ünïcode <ok>"},
        {"role": "assistant", "content": "It is 84."},
    ],
}


@pytest.fixture(scope="module")
def pair(tiny_qwen2):
    return load_tokenizer(tiny_qwen2), transformers.AutoTokenizer.from_pretrained(tiny_qwen2)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_matches_transformers(pair, name, tools, add_generation_prompt):
    ours, ref = pair
    messages = CONVERSATIONS[name]
    expected = ref.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    got = ours.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt
    )
    assert got == expected
    assert got.endswith("<|im_start|>assistant\n") == add_generation_prompt
    if tools:
        # tojson must not HTML-escape (Jinja's built-in filter would write \u003c)
        assert "Evaluate <arithmetic> & return it" in got


def test_message_structs_render_like_dicts(pair):
    ours, _ = pair
    structs = [
        Message(role="system", content="S"),
        Message(role="user", content="Q"),
        Message(role="tool", content="R", name="calculator"),
    ]
    dicts = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "tool", "content": "R", "name": "calculator"},
    ]
    assert ours.apply_chat_template(structs) == ours.apply_chat_template(dicts)
    assert "<tool_response>\nR\n</tool_response>" in ours.apply_chat_template(structs)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_encoding_matches_transformers_and_round_trips(pair, text):
    ours, ref = pair
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids)
    # byte-level BPE: anything encodes and decodes back (up to NFC normalisation)
    import unicodedata

    assert ours.decode(ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=12))
def test_remembered_encodings_equal_fresh_ones_and_are_the_callers_own(pair, texts):
    ours, ref = pair
    for text in texts + texts:  # the second time from the cache
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False)
        ids.append(-1)  # a caller's list is its own: the cache is untouched
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False)


def test_the_encoding_cache_stays_bounded(pair, monkeypatch):
    from agentrl.model import tokenizer as module

    ours, _ = pair
    monkeypatch.setattr(module, "ENCODE_CACHE_TEXTS", 5)
    for i in range(23):
        ours.encode(f"text number {i}")
    assert 0 < len(ours._encoded) <= 5
    ours.encode("x" * (module.ENCODE_CACHE_CHARS + 1))
    assert "x" * (module.ENCODE_CACHE_CHARS + 1) not in ours._encoded


def test_special_and_tool_tokens(pair):
    ours, ref = pair
    for token in (*SPECIAL_TOKENS, *TOOL_TOKENS):
        token_id = ours.token_to_id(token)
        assert token_id is not None
        assert ours.encode(f"a{token}b")[1] == token_id
    assert ours.eos_token_id == ours.token_to_id("<|im_end|>") == ref.eos_token_id
    assert ours.pad_token_id == ours.token_to_id("<|endoftext|>")
    assert ours.vocab_size == len(ref)
    ids = ours.encode("<|im_start|>x<tool_call>y</tool_call><|im_end|>")
    # special tokens are skipped on request; tool markup is content and stays
    assert ours.decode(ids, skip_special_tokens=True) == "x<tool_call>y</tool_call>"
    assert ours.decode(ids) == "<|im_start|>x<tool_call>y</tool_call><|im_end|>"


def test_raise_exception_and_missing_template(tmp_path, tiny_qwen2):
    import jinja2

    config = json.loads((tiny_qwen2 / "tokenizer_config.json").read_text())
    for name in ("tokenizer.json",):
        (tmp_path / name).write_bytes((tiny_qwen2 / name).read_bytes())
    config["chat_template"] = "{{ raise_exception('no ' + messages[0].role + ' allowed') }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(jinja2.exceptions.TemplateError, match="no user allowed"):
        load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat_template"):
        load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json_is_explained(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json does not exist"):
        load_tokenizer(tmp_path)


def test_tiny_checkpoint_is_deterministic(tmp_path):
    a = build_tiny_checkpoint(tmp_path / "a", family="llama", seed=3)
    b = build_tiny_checkpoint(tmp_path / "b", family="llama", seed=3)
    c = build_tiny_checkpoint(tmp_path / "c", family="llama", seed=4)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_a_punctuation_mark_never_joins_the_word_after_it(tmp_path):
    """Fitted on text where ``<answer>owl`` is common, the merges still leave ``owl`` the
    token it is at a line's start (``>owl`` would be a third form of the name to learn),
    and the folder keeps Qwen2's pipeline: transformers encodes it the same."""
    lines = ["<answer>owl = 6</answer>", "(owl) [owl] 'owl' \"owl\"", "What is owl?",
             "\nowl: 6\n", "<tool_call>\n{\"name\": \"read\"}\n</tool_call>"]
    folder = build_tiny_checkpoint(tmp_path, corpus=lines * 200, vocab_size=400)
    ours, ref = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    (owl,) = ours.encode("owl")
    assert len(ours.encode(" owl")) == 1  # a space still joins the word
    for text in ("<answer>owl", "(owl)", "[owl]", "'owl'", '"owl"', "\nowl"):
        ids = ours.encode(text)
        assert owl in ids, (text, [ours.decode([i]) for i in ids])
        assert ids == ref.encode(text, add_special_tokens=False)

"""Each model family's tool-call parser: the shared corpus, round trips through its
``format_call``, the error kinds an environment reports, and the per-model choice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs import Task
from agentrl.envs.parsers import PARSERS, adopt_tool_format, detect_tool_format, make_parser
from agentrl.envs.tools import HermesParser, ToolCall, ToolCallError
from agentrl.model.chat_template import QWEN25_CHAT_TEMPLATE
from agentrl.types import Message
from tests.models.families import AddToolEnv
from tests.models.tool_call_corpus import CORPUS, SCHEMAS

CASES = [(fmt, *case) for fmt, cases in CORPUS.items() for case in cases]


@pytest.mark.parametrize(("fmt", "text", "calls", "errors"), CASES)
def test_the_corpus_parses_to_its_calls_and_errors(fmt, text, calls, errors):
    parsed = make_parser(fmt, SCHEMAS).parse(text)
    assert [(c.name, c.arguments) for c in parsed if isinstance(c, ToolCall)] == calls
    assert [c.kind for c in parsed if isinstance(c, ToolCallError)] == errors


def test_every_format_has_corpus_entries():
    assert set(CORPUS) == set(PARSERS)


_KEYS = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
_TEXT = st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs")), max_size=20).map(
    str.strip).filter(lambda t: t and t.lower() not in ("true", "false"))
_VALUES = st.one_of(_TEXT, st.integers(-10**6, 10**6), st.booleans())
_TYPES = {str: "string", int: "integer", bool: "boolean"}


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(sorted(PARSERS)), name=_KEYS,
       arguments=st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_format_call_round_trips_through_parse(fmt, name, arguments):
    schema = {"properties": {k: {"type": _TYPES[type(v)]} for k, v in arguments.items()}}
    parser = make_parser(fmt, {name: schema})
    assert parser.parse(parser.format_call(name, arguments)) == [ToolCall(name, arguments)]


class CalcEnv(AddToolEnv):
    """One tool; answers "done"."""

    max_turns = 3

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task([Message("user", "add")], key="t")

    def grade(self, answer: str) -> float:
        return float(answer.strip() == "done")


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_an_environment_in_each_format_runs_calls_and_names_errors(fmt):
    env = adopt_tool_format(CalcEnv(), fmt)
    env.reset(seed=0)
    observation, _, done, _, info = env.step(env.format_call("add", a=2, b=3))
    assert not done and observation[0].content == "5" and info["tool_errors"] == {}
    observation, _, _, _, info = env.step(env.format_call("nope", a=1))
    assert info["tool_errors"] == {"unknown_tool": 1}
    assert "no tool named 'nope'" in observation[0].content
    bad = next(t for t, calls, errors in CORPUS[fmt] if errors)
    _, _, _, _, info = env.step(bad)
    assert set(info["tool_errors"]) <= {"malformed_json", "malformed_call"}
    assert sum(info["tool_errors"].values()) == 1


def test_an_explicit_parser_is_kept_and_a_default_one_adopts_the_models():
    explicit = adopt_tool_format(CalcEnv(parser="hermes"), "llama3_json")
    assert isinstance(explicit.parser, HermesParser)
    adopted = adopt_tool_format(CalcEnv(), "llama3_json")
    assert adopted.parser.name == "llama3_json"
    assert adopted.format_call("add", a=1, b=2) == '{"name": "add", "parameters": {"a": 1, "b": 2}}'


def test_the_format_is_read_from_the_template():
    assert detect_tool_format(QWEN25_CHAT_TEMPLATE)[0] == "hermes"
    assert detect_tool_format("{{ '[TOOL_CALLS]' }}")[0] == "mistral"
    name, why = detect_tool_format("{{ messages }}")
    assert name == "hermes" and "default" in why


def test_an_unknown_format_names_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        make_parser("llama4")

"""Tool schemas from hints and docstrings; parsing and running calls from model text."""

from __future__ import annotations

import json
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.envs import AgentEnv, Task
from agentrl.envs.tools import HermesParser, ToolCall, ToolCallError, build_spec, tool
from agentrl.types import Message


class ToyEnv(AgentEnv):
    """Tools that succeed, fail and hang, for the error paths."""

    max_turns = 5
    tool_timeout_s = 0.3

    @tool
    def add(self, a: int, b: float = 1.0) -> float:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number,
                which defaults to one.
        """
        return a + b

    @tool
    def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("kaput")

    @tool(timeout_s=0.1)
    def hang(self) -> str:
        """Never returns in time."""
        time.sleep(1.0)
        return "late"

    def sample_task(self, rng: np.random.Generator) -> Task:
        return Task([Message("user", f"task {int(rng.integers(1000))}")], key="t")

    def grade(self, answer: str) -> float:
        return float(answer.strip() == "done")


def call(name: str, arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_schema_from_hints_and_docstring():
    spec = build_spec(ToyEnv.add)
    assert spec.schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "number",
                          "description": "The second number, which defaults to one."},
                },
                "required": ["a"],
            },
        },
    }
    assert [s["function"]["name"] for s in ToyEnv().tool_schemas()] == ["add", "boom", "hang"]


def test_parser_reads_calls_and_reports_malformed_ones():
    parser = HermesParser()
    text = ('think <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> and '
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>'
            "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call><tool_call>{")
    calls = parser.parse(text)
    assert calls[0] == ToolCall("add", {"a": 1})
    assert calls[1] == ToolCall("add", {"a": 2})  # double-encoded arguments are decoded
    assert [c.kind for c in calls[2:]] == ["malformed_json", "malformed_call", "malformed_call"]
    assert parser.parse("no calls here, the answer is 4") == []


def step(env: ToyEnv, text: str):
    env.reset(seed=0)
    return env.step(text)


def test_each_failure_becomes_a_tool_message_and_a_count():
    env = ToyEnv()
    cases = {
        "<tool_call>{oops}</tool_call>": "malformed_json",
        call("nope", {}): "unknown_tool",
        call("add", {"a": "one"}): "invalid_arguments",
        call("add", {}): "invalid_arguments",
        call("add", {"a": 1, "c": 2}): "invalid_arguments",
        call("boom", {}): "tool_exception",
        call("hang", {}): "timeout",
    }
    for text, kind in cases.items():
        obs, reward, terminated, truncated, info = step(env, text)
        assert info["tool_errors"] == {kind: 1}, text
        assert len(obs) == 1 and obs[0].role == "tool" and obs[0].content.startswith("Error")
        assert (reward, terminated, truncated) == (0.0, False, False)


def test_successful_call_and_int_for_float():
    obs, _, _, _, info = step(ToyEnv(), call("add", {"a": 2, "b": 3}) + call("add", {"a": 4}))
    assert [(m.role, m.name, m.content) for m in obs] == [("tool", "add", "5.0"),
                                                          ("tool", "add", "5.0")]
    assert info["tool_errors"] == {} and info["num_tool_calls"] == 2


def test_too_many_calls_are_skipped_and_counted():
    env = ToyEnv()
    env.max_tool_calls_per_turn = 2
    obs, _, _, _, info = step(env, call("add", {"a": 1}) * 5)
    assert info["tool_errors"] == {"too_many_calls": 3}
    assert len(obs) == 3


def test_final_answer_terminates_and_turn_limit_truncates():
    env = ToyEnv(max_turns=2)
    env.reset(seed=1)
    assert env.step(call("add", {"a": 1}))[3] is False
    assert env.step(call("add", {"a": 1}))[3] is True  # second turn without an answer
    env.reset(seed=1)
    _, reward, terminated, _, _ = env.step("done")
    assert (reward, terminated) == (1.0, True)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/{}[]":,\\ abtool_cname0123'))) | st.text())
def test_arbitrary_text_never_raises(text):
    calls = HermesParser().parse(text)
    assert all(isinstance(c, ToolCall | ToolCallError) for c in calls)
    env = ToyEnv()
    env.tool_timeout_s = 0.05
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<tool_call>" + text + "</tool_call>")
    assert isinstance(reward, float) and isinstance(info["tool_errors"], dict)


class EchoEnv(ToyEnv):
    """A tool that echoes the model's text, a thousand times."""

    @tool
    def echo(self, text: str) -> str:
        """Echo the text back, repeated.

        Args:
            text: What to echo.
        """
        return text * 1000


class AwkwardResultsEnv(EchoEnv):
    """Tools whose result or error cannot simply be printed."""

    @tool
    def big(self, digits: int) -> int:
        """A number of that many digits.

        Args:
            digits: How many.
        """
        return 10 ** (digits - 1)

    @tool
    def fail(self, why: str) -> str:
        """Raise an exception that cannot print itself.

        Args:
            why: Ignored.
        """

        class Unprintable(RuntimeError):
            def __str__(self) -> str:
                raise ValueError("no")

        raise Unprintable


def test_results_and_errors_that_cannot_be_printed_still_answer_the_model():
    env = AwkwardResultsEnv()
    obs, *_ = step(env, call("big", {"digits": 5000}) + call("fail", {"why": "x"}))
    assert obs[0].content == "<int that cannot be printed>"  # json and str both raise
    assert obs[1].content.endswith("Unprintable: <unprintable>")


def test_tool_messages_are_valid_utf8_and_bounded():
    # a tool echoing model JSON "\ud800" once made the tokenizer raise; huge output and an
    # error echoing a 100,000-character tool name once flooded the context
    env = EchoEnv()
    env.max_tool_output_chars = 500
    raw = '<tool_call>{"name": "echo", "arguments": {"text": "a\\ud800b"}}</tool_call>'
    obs, *_ = step(env, raw + call("x" * 100_000, {}))
    echoed, unknown = obs[0].content, obs[1].content
    assert echoed.startswith("a\ufffdb" * 10) and len(echoed) <= 500
    assert "more characters of the tool's output cut]" in echoed
    assert len(unknown) <= 1_000 and "... (100000 characters)" in unknown
    assert len(obs[1].name) <= 64
    for message in obs:
        message.content.encode("utf-8")


def test_text_helpers():
    from agentrl.text import brief, clip, short_repr, valid_utf8

    assert valid_utf8("ok") == "ok" and valid_utf8("a\ud800") == "a\ufffd"
    assert valid_utf8("\ud83d\ude00") == "\U0001f600"  # a pair written as two code points
    assert clip("abc", 5) == "abc"
    cut = clip("x" * 100, 60, "it")  # the marker takes 35 of the 60 characters
    assert cut == "x" * 25 + "\n[... 75 more characters of it cut]" and len(cut) == 60
    assert short_repr(10 ** 5000) == "<int that cannot be printed>"
    assert short_repr("y" * 500, 10) == "'yyyyyyyyyy'... (500 characters)"
    assert brief("z" * 500, 10) == "zzzzzzzzzz... (500 characters)"  # no quote lost
    assert brief("line one\n  line two") == "line one line two"

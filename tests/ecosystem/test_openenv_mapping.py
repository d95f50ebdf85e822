"""The documented mapping between the policy's text and messages and an OpenEnv server's
actions and observations (agentrl/envs/adapters/openenv_mapping.py), and how failures of
OpenEnv's client are named; no server needed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosedError

from agentrl.envs.adapters.openenv_mapping import (
    ActionMapping,
    BadObservation,
    InvalidAction,
    observation_messages,
    observation_tools,
    text_field,
)
from agentrl.envs.adapters.openenv_session import check_reply, classify
from agentrl.envs.adapters.remote import RemoteEnvError
from agentrl.envs.registry import load_object
from agentrl.envs.tools import HermesParser, format_call
from agentrl.types import Message

METADATA = {"metadata": {"type": "object"}}
TEMPLATE = {"properties": {**METADATA, "message": {"type": "string"}}, "required": ["message"]}
WITH_OPTIONS = {"properties": {**METADATA, "text": {"type": "string"},
                               "verbose": {"type": "boolean", "default": False}},
                "required": ["text"]}
MOVE = {"properties": {**METADATA, "dx": {"type": "integer"}, "dy": {"type": "integer"}},
        "required": ["dx", "dy"], "description": "Move on the grid."}


def test_which_field_the_text_goes_into():
    assert text_field(TEMPLATE) == "message"  # the only field
    assert text_field(WITH_OPTIONS) == "text"  # the one required string
    assert text_field(MOVE) is None  # structured
    assert text_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "required": ["a", "b"]}) is None
    assert ActionMapping(MOVE, field="dx").action("3") == {"dx": "3"}  # action_field
    with pytest.raises(ValueError, match="action_field 'nope' is not a field"):
        ActionMapping(MOVE, field="nope")
    with pytest.raises(ValueError, match="MCP tool environment"):
        ActionMapping({"properties": METADATA})  # OpenEnv's bare Action


@given(st.text())
def test_any_text_is_sent_as_it_is(text):
    assert ActionMapping(TEMPLATE).action(text) == {"message": text}


def test_a_structured_action_is_the_action_tool():
    mapping = ActionMapping(MOVE, parser=HermesParser())
    [tool] = mapping.tool_schemas()
    assert tool["function"]["name"] == "action"
    assert tool["function"]["description"] == "Move on the grid."
    assert tool["function"]["parameters"]["required"] == ["dx", "dy"]
    assert "metadata" not in tool["function"]["parameters"]["properties"]
    assert mapping.action(format_call("action", dx=1, dy=-1)) == {"dx": 1, "dy": -1}
    assert mapping.action('```json\n{"dx": 0, "dy": 2}\n```') == {"dx": 0, "dy": 2}
    for text, kind in [("go left", "malformed_json"), ('{"dx": 1}', "invalid_arguments"),
                       (format_call("jump", height=2), "unknown_tool"),
                       ("<tool_call>{nope</tool_call>", "malformed_json")]:
        with pytest.raises(InvalidAction) as caught:
            mapping.action(text)
        assert caught.value.kind == kind, text
    assert ActionMapping(TEMPLATE).tool_schemas() == []


def test_custom_maps_from_a_file(tmp_path):
    (tmp_path / "maps.py").write_text(
        "def act(text, schema):\n"
        "    if not text.isdigit():\n"
        "        raise ValueError('write a number')\n"
        "    return {'dx': int(text), 'dy': 0}\n"
        "def show(observation, is_reset):\n"
        "    return [{'role': 'user', 'content': f\"at {observation['position']}\"}]\n")
    act = load_object(f"{tmp_path}/maps.py:act", "action_map")
    mapping = ActionMapping(MOVE, custom=act)
    assert mapping.mode == "custom" and mapping.action("4") == {"dx": 4, "dy": 0}
    with pytest.raises(InvalidAction, match="write a number"):
        mapping.action("four")
    show = load_object(f"{tmp_path}/maps.py:show", "observation_map")
    assert observation_messages({"position": [1, 2]}, custom=show) == [
        Message("user", "at [1, 2]")]
    with pytest.raises(ValueError, match="has no 'missing'"):
        load_object(f"{tmp_path}/maps.py:missing", "action_map")


def test_observations_become_messages():
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "tool", "content": "4", "name": "calculate"}],
            "tools": [{"type": "function", "function": {"name": "calculate"}}],
            "done": False, "reward": None, "metadata": {}}
    assert observation_messages(chat) == [Message("system", "Be brief."),
                                          Message("tool", "4", "calculate")]
    assert observation_tools(chat) == chat["tools"]
    echo = {"echoed_message": "hi", "message_length": 2, "done": False, "metadata": {}}
    assert observation_messages(echo) == [Message("user", "hi")]  # its one text field
    grid = {"position": [0, 1], "goal": [2, 2], "done": False}
    assert observation_messages(grid) == [Message("user", '{"goal": [2, 2], "position": '
                                                          '[0, 1]}')]
    assert observation_messages(grid, field="goal") == [Message("user", "[2, 2]")]
    assert observation_messages({"done": True, "reward": 1.0}) == []
    for bad in ([1, 2], {"messages": "text"}, {"messages": [{"role": "robot", "content": ""}]}):
        with pytest.raises(BadObservation):
            observation_messages(bad)
    with pytest.raises(BadObservation, match="no field 'score'"):
        observation_messages(grid, field="score")


def test_malformed_replies_are_named():
    assert check_reply("u", "step", {}, None, False) == ({}, 0.0, False)
    for observation, reward, done in [([], 0.0, False), ({}, math.nan, False), ({}, "1", False),
                                      ({}, True, False), ({}, 1.0, "yes")]:
        with pytest.raises(RemoteEnvError) as caught:
            check_reply("u", "step", observation, reward, done)
        assert caught.value.kind == "env_bad_reply"


@pytest.mark.parametrize("exc, kind", [
    (TimeoutError(), "env_server_timeout"),
    (ConnectionClosedError(None, None), "env_disconnected"),
    (ConnectionError("Failed to connect to ws://x/ws: refused"), "env_unreachable"),
    (RuntimeError("Server error: at capacity (code: CAPACITY_REACHED)"), "env_server_full"),
    (RuntimeError("Server error: boom (code: EXECUTION_ERROR)"), "env_server_error"),
    (ValueError("Expecting value: line 1"), "env_bad_reply"),
])
def test_client_failures_are_named(exc, kind):
    assert classify("http://x", "step", exc, 5.0).kind == kind

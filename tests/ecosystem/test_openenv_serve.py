"""``agentrl serve-env``: agentrl environments served by OpenEnv's own server code and
played by OpenEnv's own client give the rewards of in-process play; ``check-env`` works
on the server's URL."""

from __future__ import annotations

import json
import urllib.request

import pytest
from openenv.core import GenericEnvClient

from agentrl.cli import main
from agentrl.envs.registry import make
from agentrl.types import Message

ENVS = ["agentrl/Calculator-v0", "agentrl/Countdown-v0"]


@pytest.fixture(scope="module")
def servers(serve_env) -> dict[str, str]:
    return {env_id: serve_env(env_id, "--expose-demonstrations") for env_id in ENVS}


def local_episode(env_id: str, seed: int, wrong: bool) -> tuple[list, list[str], list[float]]:
    """In-process play of the scripted policy (or a wrong final answer): the messages of
    each step, the actions, the step rewards."""
    env = make(env_id)
    messages, _ = env.reset(seed=seed)
    transcript, shown, actions, rewards = list(messages), [messages], [], []
    while True:
        action = env.demonstrate(transcript)
        if wrong and "<tool_call>" not in action:
            action = "I give up"
        observation, reward, terminated, truncated, _ = env.step(action)
        transcript += [Message("assistant", action), *observation]
        shown.append(observation)
        actions.append(action)
        rewards.append(reward)
        if terminated or truncated:
            return shown, actions, rewards


def as_wire(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
            for m in messages]


@pytest.mark.parametrize("env_id", ENVS)
@pytest.mark.parametrize("wrong", [False, True])
def test_openenvs_client_gets_the_rewards_of_in_process_play(servers, env_id, wrong):
    for seed in range(4):
        shown, actions, rewards = local_episode(env_id, seed, wrong)
        with GenericEnvClient(base_url=servers[env_id]).sync() as client:
            result = client.reset(seed=seed)
            assert result.observation["messages"] == as_wire(shown[0])
            assert result.observation["tools"] == make(env_id).tool_schemas()
            served = []
            for index, action in enumerate(actions):
                result = client.step({"text": action})
                assert result.observation["messages"] == as_wire(shown[index + 1])
                served.append(result.reward)
            assert result.done
        assert served == rewards
        assert sum(served) == (0.0 if wrong else 1.0)


def test_the_server_describes_its_actions_and_tools(servers):
    url = servers["agentrl/Calculator-v0"]
    with urllib.request.urlopen(f"{url}/schema") as response:
        schema = json.loads(response.read())
    assert schema["action"]["required"] == ["text"]
    assert {"messages", "tools", "truncated"} <= set(schema["observation"]["properties"])
    with urllib.request.urlopen(f"{url}/metadata") as response:
        assert "tools: calculate" in json.loads(response.read())["description"]


def test_agentrls_adapter_sees_the_environment_as_in_process(servers):
    url = servers["agentrl/Calculator-v0"]
    env, remote = make("agentrl/Calculator-v0"), make("agentrl/OpenEnv-v0", url=url)
    assert remote.reset(seed=5)[0] == env.reset(seed=5)[0]
    assert remote.tool_schemas() == env.tool_schemas()
    assert remote.demonstrate([]) == env.demonstrate(list(env.history))
    remote.close()


def test_check_env_on_a_served_url(servers, capsys):
    assert main(["check-env", servers["agentrl/Calculator-v0"], "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert '"name": "calculate"' in out  # the tools, declared at reset
    assert "scripted episodes: the environment's demonstrate() policy" in out
    assert out.count("terminated; reward 1") == 2
    assert "gymnasium check_env: passed" in out

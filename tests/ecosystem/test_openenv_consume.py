"""OpenEnv environments as AgentEnvs, against real OpenEnv servers: OpenEnv's template
environment (``openenv init``) started from a command and from its installed package,
and environments written against OpenEnv's interfaces (tests/ecosystem/openenv_apps.py)
served by OpenEnv's own app. Failures invalidate the rollout with a named kind through
the runner's own containment; sessions close on every path, a SIGKILLed owner included."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from agentrl.config import config_from_dict
from agentrl.envs.adapters.openenv_launch import local_server
from agentrl.envs.adapters.remote import RemoteEnvError
from agentrl.envs.registry import make
from agentrl.envs.tools import format_call
from agentrl.model import build_tiny_checkpoint, load_tokenizer
from agentrl.rollout.env_guard import GuardedEnv
from agentrl.rollout.health import InvalidRolloutWarning
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from tests.rollout.stand_ins import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
ID = "agentrl/OpenEnv-v0"


def app_command(app: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", f"tests.ecosystem.openenv_apps:{app}",
            "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", *extra]


@pytest.fixture(scope="module")
def combo_url() -> str:
    """One server for the apps of tests/ecosystem/openenv_apps.py (under their paths)."""
    return local_server(app_command("combo_app"), ROOT, 120)


@pytest.fixture(scope="module")
def faulty_url(combo_url) -> str:
    return f"{combo_url}/faulty"


def test_the_template_environment_from_a_command(echo_env_dir):
    env = make(ID, command="python -m uvicorn server.app:app --port {port}",
               cwd=str(echo_env_dir), system_prompt="Echo something.", max_turns=2)
    assert env.mapping.mode == "field" and env.mapping.field == "message"  # from /schema
    messages, info = env.reset(seed=0)
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[1].content == "Echo Env environment ready!"  # its one text field
    assert env.tool_schemas() == []
    observation, reward, terminated, truncated, _ = env.step("hello")
    assert observation[0].content == "hello" and reward == pytest.approx(0.5)  # len * 0.1
    observation, reward, terminated, truncated, _ = env.step("a much longer message")
    assert reward == 1.0 and not terminated and truncated  # max_turns = 2
    env.close()
    # a second instance in this process shares the server the first one started
    again = make(ID, command="python -m uvicorn server.app:app --port {port}",
                 cwd=str(echo_env_dir))
    assert again.base_url == env.base_url
    again.close()


def test_an_installed_environment_package(echo_env_dir, tmp_path, monkeypatch):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(echo_env_dir)],
                   check=True, capture_output=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # OpenEnv's discovery cache
    env = make("openenv/echo_env")
    messages, _ = env.reset(seed=1)
    assert messages[0].content == "Echo Env environment ready!"
    assert env.step("hi")[1] == pytest.approx(0.2)
    env.close()
    with pytest.raises(ValueError, match="no installed OpenEnv environment 'nothing_env'"):
        make("openenv/nothing_env")


def test_a_structured_action_is_one_tool_call_checked_before_sending(combo_url):
    env = make(ID, url=f"{combo_url}/grid")
    assert env.mapping.mode == "json"
    [schema] = env.tool_schemas()
    assert schema["function"]["name"] == "action"
    assert set(schema["function"]["parameters"]["properties"]) == {"dx", "dy"}
    messages, _ = env.reset(seed=4)  # goal (2, 1)
    assert json.loads(messages[0].content) == {"goal": [2, 1], "position": [0, 0]}
    # what the policy writes wrong never reaches the server and is answered as the tool
    observation, reward, terminated, _, info = env.step("move right please")
    assert info["tool_errors"] == {"malformed_json": 1} and reward == 0.0
    assert observation[0].role == "tool" and "malformed_json" in observation[0].content
    _, _, _, _, info = env.step(format_call("action", dx="two", dy=1))
    assert info["tool_errors"] == {"invalid_arguments": 1}
    observation, reward, terminated, _, info = env.step(format_call("action", dx=1, dy=1))
    assert info["tool_errors"] == {} and json.loads(observation[0].content)["position"] == [1, 1]
    observation, reward, terminated, _, _ = env.step('{"dx": 1, "dy": 0}')  # bare JSON
    assert reward == 1.0 and terminated
    env.close()


def test_a_server_without_websocket_is_played_over_http(combo_url):
    env = make(ID, url=f"{combo_url}/http")
    with pytest.warns(UserWarning, match="offers no WebSocket session"):
        messages, _ = env.reset(seed=2)
    assert messages[0].content == "task 2: say ok"
    assert env.step("ok")[1:3] == (1.0, True)
    env.close()


@pytest.mark.parametrize("reply, kind, words", [
    ("boom", "env_server_error", "the environment exploded"),
    ("sleep", "env_server_timeout", "no answer within 1 s"),
    ("bad", "env_bad_reply", "'messages' is not a list"),
])
def test_a_failing_server_invalidates_the_rollout_with_its_reason(faulty_url, reply, kind,
                                                                   words):
    async def play() -> None:
        env = await GuardedEnv.open("faulty", lambda: make(ID, url=faulty_url, timeout_s=1.0),
                                    10.0, 100_000)
        await env.reset(0)
        try:
            await env.step(reply)
        finally:
            await env.close()

    with pytest.raises(Exception) as caught:
        asyncio.run(play())
    assert caught.value.kind == kind and words in str(caught.value)


def test_the_reason_is_named_in_a_worker_process_too(faulty_url):
    async def play() -> None:
        factory = functools.partial(make, ID, url=faulty_url)
        env = await GuardedEnv.open("faulty", factory, 30.0, 100_000, isolation="process",
                                    construct_timeout_s=60.0)
        try:
            await env.reset(0)
            await env.step("boom")
        finally:
            await env.close()

    with pytest.raises(Exception) as caught:
        asyncio.run(play())
    assert caught.value.kind == "env_server_error"


def test_failures_never_stop_a_collection(faulty_url, tmp_path):
    """A real runner collection: the rollouts that said "boom" are invalid with
    env_server_error, the others valid with the server's reward; nothing raises."""
    tokenizer = load_tokenizer(build_tiny_checkpoint(tmp_path / "tiny"))
    config = config_from_dict({
        "environments": [{"id": ID, "name": "faulty", "kwargs": {"url": faulty_url}}],
        "batch": {"rollout_batch_size": 4, "n_samples_per_prompt": 2, "global_batch_size": 8},
        "rollout": {"max_turns": 2}})
    said = iter(["ok", "boom"] * 8)
    engine = ScriptedEngine(tokenizer, lambda prompt, params: next(said))
    runner = RolloutRunner(config, engine, tokenizer, EnvironmentSampler({"faulty": 1.0}, 0))
    with pytest.warns(InvalidRolloutWarning, match="env_server_error"):
        result = asyncio.run(runner.collect(1, 8))
    rollouts = [r for g in result.groups for r in g.rollouts]
    assert len(rollouts) == 8
    kinds = sorted(r.stats.error_kind or "valid" for r in rollouts)
    assert kinds == ["env_server_error"] * 4 + ["valid"] * 4
    assert all(r.reward == 1.0 for r in rollouts if r.valid)


def test_an_unreachable_server_and_a_dead_server_are_named(tmp_path):
    from agentrl.envs.adapters.openenv_launch import free_port

    with pytest.raises(RemoteEnvError) as caught:
        make(ID, url=f"http://127.0.0.1:{free_port()}")
    assert caught.value.kind == "env_unreachable"
    url = local_server(app_command("faulty_app", "--timeout-keep-alive", "3"), ROOT, 120)
    env = make(ID, url=url)
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError) as caught:
        env.step("exit")  # the server process dies mid-step
    assert caught.value.kind == "env_disconnected"
    env.close()


def open_sessions(url: str, count: int, wait_s: float = 0.5) -> list:
    envs = []
    for _ in range(count):
        env = make(ID, url=url, session_wait_s=wait_s)
        env.reset(seed=0)
        envs.append(env)
    return envs


def test_closing_releases_the_session(combo_url):
    url = f"{combo_url}/small"  # 2 sessions at most
    first = open_sessions(url, 2)
    with pytest.raises(RemoteEnvError) as caught:
        open_sessions(url, 1)
    assert caught.value.kind == "env_server_full" and "max_concurrent_envs" in str(caught.value)
    first[0].close()
    [third] = open_sessions(url, 1, wait_s=5.0)
    assert third.step("ok")[1] == 1.0
    for env in (first[1], third):
        env.close()


OWNER = textwrap.dedent("""
    import sys, time
    from agentrl.envs.registry import make
    from agentrl.envs.adapters import openenv_launch
    kwargs = dict(url=sys.argv[1]) if sys.argv[1].startswith("http") else dict(
        command=sys.argv[1:], cwd=".")
    envs = [make("agentrl/OpenEnv-v0", **kwargs) for _ in range(2)]
    for env in envs:
        env.reset(seed=0)
    pids = [proc.pid for proc, _ in openenv_launch._servers.values()]
    print(envs[0].base_url, *pids, flush=True)
    time.sleep(600)
""")


def running(pid: str) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def start_owner(*argv: str) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line, "the owner process did not open its sessions"
    return proc, line


@pytest.mark.slow
def test_a_killed_owner_releases_its_sessions_and_stops_its_server(combo_url):
    url = f"{combo_url}/small"
    owner, _ = start_owner(url)  # holds both of the server's sessions
    with pytest.raises(RemoteEnvError):
        open_sessions(url, 1)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    envs = open_sessions(url, 2, wait_s=10.0)  # its connections closed with it
    for env in envs:
        env.close()
    # a server the killed process started itself stops with it
    owner, (served, pid) = start_owner(*app_command("faulty_app"))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.2)
    assert not running(pid), "the server outlived the process that started it"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{served}/health", timeout=2)

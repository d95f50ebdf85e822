"""``agentrl serve-env`` under attack (issue 41): clients that connect and never send
cannot hold every session; an environment whose calls would vanish is refused at
start-up; OpenEnv's stateless ``POST /step`` gets a 4xx pointing at the WebSocket route."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.ecosystem.conftest import ROOT

RESET = json.dumps({"type": "reset", "data": {"seed": 0}})


def play_reset(url: str) -> dict:
    """One WebSocket session's reset reply ({"type": "closed"} when refused by a close)."""
    with connect(url.replace("http://", "ws://") + "/ws", open_timeout=10) as ws:
        try:
            ws.send(RESET)
            return json.loads(ws.recv(timeout=30))
        except ConnectionClosed as exc:
            return {"type": "closed", "reason": str(exc)}


def test_silent_clients_are_closed_and_the_next_client_gets_in(serve_env) -> None:
    url = serve_env("agentrl/Calculator-v0", "--max-sessions", "4", "--idle-timeout-s", "1")
    silent = [connect(url.replace("http://", "ws://") + "/ws", open_timeout=10)
              for _ in range(4)]  # connect, hold a session each, never send
    try:
        reply: dict = {}
        for _ in range(40):  # 20 s at most
            reply = play_reset(url)
            if reply.get("type") == "observation":
                break
            time.sleep(0.5)
        assert reply.get("type") == "observation", f"the 5th client was refused: {reply}"
        for ws in silent:  # the server closed each idle socket itself
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
    finally:
        for ws in silent:
            ws.close()


def test_a_stateless_http_step_is_refused_with_a_pointer_to_the_websocket(serve_env) -> None:
    url = serve_env("agentrl/Calculator-v0")
    request = urllib.request.Request(f"{url}/step", data=json.dumps(
        {"action": {"text": "<answer>3</answer>"}}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "/ws" in json.loads(refused.value.read())["detail"]
    assert play_reset(url)["type"] == "observation"  # the WebSocket route still plays


def test_an_environment_with_subagents_is_refused_at_start_up() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve-env",
                             "tests.env.test_subagent_env:Library", "--host", "127.0.0.1",
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # ends when it exits, or at its ready line
            lines.append(line)
            assert not line.startswith("agentrl serve-env:"), f"it started serving: {lines}"
        assert proc.wait(timeout=60) == 2, lines
    finally:
        proc.kill()
        proc.wait()
    [error] = [line for line in lines if line.startswith("error:")]
    assert "@subagent" in error and "ask" in error


TOKEN = "a-shared-token-of-32-characters!"


def test_a_token_protected_server_refuses_strangers_and_plays_agentrls_own_client(
        serve_env, tmp_path, monkeypatch) -> None:
    from agentrl.envs.adapters.remote import RemoteEnvError
    from agentrl.envs.registry import make

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    url = serve_env("agentrl/Calculator-v0", "--token-file", str(token_file))
    monkeypatch.delenv("AGENTRL_TOKEN", raising=False)
    monkeypatch.delenv("AGENTRL_TOKEN_FILE", raising=False)
    with pytest.raises(urllib.error.HTTPError) as refused:  # a stranger's GET
        urllib.request.urlopen(f"{url}/schema", timeout=30)
    assert refused.value.code == 401
    with pytest.raises(RemoteEnvError, match="HTTP 401"):  # agentrl's client, no token
        make("agentrl/OpenEnv-v0", url=url)
    monkeypatch.setenv("AGENTRL_TOKEN_FILE", str(token_file))  # the trainer's side
    env, remote = make("agentrl/Calculator-v0"), make("agentrl/OpenEnv-v0", url=url)
    assert remote.reset(seed=5)[0] == env.reset(seed=5)[0]
    assert remote.tool_schemas() == env.tool_schemas()
    remote.close()

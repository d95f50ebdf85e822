"""Every server agentrl starts listens on loopback unless told otherwise; another address
needs the shared token and says what becomes reachable; the ready line gives an address
a client can connect to; vLLM's unauthenticated RL routes never face the network."""

from __future__ import annotations

import asyncio
import urllib.parse

import pytest

from agentrl.cli import build_parser, main
from agentrl.config import ConfigError, config_from_dict
from agentrl.engines.auth import TokenGate, guard_asgi, load_token
from agentrl.engines.collective import store_host
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.spawn import spawn_servers
from agentrl.model import build_tiny_checkpoint
from tests.engines.attack_tools import TOKEN, raw_exchange

ENV = [{"id": "agentrl/Countdown-v0"}]


@pytest.fixture
def no_token(monkeypatch):
    monkeypatch.delenv("AGENTRL_TOKEN", raising=False)
    monkeypatch.delenv("AGENTRL_TOKEN_FILE", raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("loopback") / "m", hidden_size=32,
                                 num_heads=2, num_kv_heads=1, vocab_size=300)


@pytest.mark.parametrize("command", [["serve", "c.toml"], ["serve-env", "agentrl/Countdown-v0"]])
def test_servers_listen_on_loopback_by_default(command):
    assert build_parser().parse_args(command).host == "127.0.0.1"


def test_serve_off_loopback_without_a_token_refuses_to_start(tiny, tmp_path, capsys, no_token):
    config = tmp_path / "serve.toml"
    config.write_text(f'[model]\npath = "{tiny}"\n[[environments]]\nid = "agentrl/Countdown-v0"\n')
    assert main(["serve", str(config), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "weight pushes" in capsys.readouterr().err  # names what would be reachable


def test_serve_env_off_loopback_without_a_token_refuses_to_start(capsys, no_token):
    assert main(["serve-env", "agentrl/Countdown-v0", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "without authentication" in capsys.readouterr().out


def test_a_vllm_replica_is_never_served_off_loopback(tiny):
    from agentrl.commands.serve import vllm_serve_command

    cfg = config_from_dict({"environments": ENV, "model": {"path": str(tiny)},
                            "rollout": {"engine": "vllm", "placement": "separate"}})
    with pytest.raises(ConfigError, match="no authentication"):
        vllm_serve_command(cfg, "0.0.0.0", 8001)
    assert vllm_serve_command(cfg, "127.0.0.1", 8001)[1] == {"VLLM_SERVER_DEV_MODE": "1"}


def test_the_weight_sync_store_listens_on_loopback_for_a_local_replica():
    assert store_host("127.0.0.1") == "127.0.0.1" == store_host("")
    assert store_host("localhost") == "127.0.0.1"


def test_the_token_comes_from_a_file_or_the_environment_and_must_be_long(tmp_path, monkeypatch,
                                                                        no_token):
    assert load_token() is None
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert load_token(str(path)) == TOKEN
    monkeypatch.setenv("AGENTRL_TOKEN_FILE", str(path))
    assert load_token() == TOKEN
    monkeypatch.setenv("AGENTRL_TOKEN", "short")
    with pytest.raises(ValueError, match="at least 16"):
        load_token()


def test_serve_env_sessions_and_requests_need_the_token():
    calls = []

    async def app(scope, receive, send):
        calls.append(scope["path"])

    guarded = guard_asgi(app, TokenGate(TOKEN, "agentrl serve-env"))

    def run(kind, headers):
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": kind, "method": "GET", "path": "/ws", "headers": headers}
        asyncio.run(guarded(scope, None, send))
        return sent

    assert run("websocket", []) == [{"type": "websocket.close", "code": 1008}]
    assert run("http", [(b"x-agentrl-token", b"nope")])[0]["status"] == 401
    assert calls == []
    assert run("websocket", [(b"x-agentrl-token", TOKEN.encode())]) == []
    assert calls == ["/ws"]


@pytest.mark.slow
def test_serve_on_all_interfaces_prints_a_connectable_address_and_checks_the_token(
        tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_TOKEN", TOKEN)
    config = tmp_path / "serve.toml"
    config.write_text(f'[model]\npath = "{tiny}"\n[[environments]]\nid = "agentrl/Countdown-v0"\n')
    (server,) = spawn_servers(config, 1, host="0.0.0.0")
    try:
        parts = urllib.parse.urlsplit(server.url)
        assert parts.hostname not in ("0.0.0.0", "", None) and parts.port
        assert not any("http://0.0.0.0" in line for line in server.output)
        assert "warning" in "".join(server.output)  # names what is reachable
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        assert raw_exchange(parts.port, request)[0] == 401
        url = f"http://127.0.0.1:{parts.port}"
        assert RemoteEngine(url).connect().model == "m"  # the token from $AGENTRL_TOKEN
    finally:
        server.stop()

"""The endpoint a run's agent programs call: started on the rollout side's event loop at
the first harness rollout, one session per rollout (docs/harnesses.md).

:class:`HarnessEndpoint` holds a :class:`agentrl.engines.chat_server.ChatServer` over the
run's engine (its replicas behind the router), listening on ``endpoint.host:port`` (and,
for sandboxed programs, on a Unix socket bound into each sandbox). Each rollout opens a
:class:`agentrl.rollout.harness_session.HarnessSession` under an unguessable id: the API
key its program is given. Sampling follows the run (``rollout.temperature``, ``top_p``, a
seed per rollout and request), whatever the program asks, so the recorded log-probs are
the ones the trainer compares with; a request's ``max_tokens`` and ``stop`` are honoured
within the run's budgets.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from agentrl.config import EndpointConfig, RolloutConfig
from agentrl.engines.auth import is_loopback
from agentrl.engines.chat_api import ChatRequest
from agentrl.engines.chat_server import ChatServer, start_chat_server
from agentrl.engines.interface import SamplingParams
from agentrl.rollout.chat_style import stop_ids_of
from agentrl.rollout.harness_session import HarnessSession, SessionLimits
from agentrl.rollout.metering import MeteredEngine
from agentrl.rollout.request_keys import new_session_key
from agentrl.staleness import generation_versions


class HarnessEndpoint:
    """The OpenAI-compatible endpoint of one run (or one validation)."""

    def __init__(self, engine: Any, tokenizer: Any, rollout: RolloutConfig,
                 endpoint: EndpointConfig | None = None) -> None:
        """Nothing listens until :meth:`start`."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.rollout = rollout
        self.config = endpoint or EndpointConfig()
        self.server = ChatServer(engine, tokenizer, self.config.model_name)
        self.port = 0
        self.socket_path: str | None = None
        self._listeners: list[asyncio.Server] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tcp: asyncio.Task | None = None
        self._unix: asyncio.Task | None = None
        self._folder: str | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` as a program on this machine reaches it."""
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}/v1"

    async def start(self, unix_socket: bool = False) -> None:
        """Listen on the running loop (again, if an earlier loop is gone); also on a Unix
        socket when ``unix_socket`` (sandboxed programs). Concurrent callers share one
        start."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._close_listeners()
            self._loop, self.socket_path, self._unix = loop, None, None
            self._tcp = loop.create_task(self._listen_tcp())
        await asyncio.shield(self._tcp)
        if unix_socket:
            if self._unix is None:
                self._unix = loop.create_task(self._listen_unix())
            await asyncio.shield(self._unix)

    async def _listen_tcp(self) -> None:
        if not is_loopback(self.config.host):  # the session ids (API keys) guard it
            warnings.warn(f"endpoint.host = {self.config.host!r}: the agent programs' "
                          "endpoint is reachable from the network; each session still needs "
                          "its secret id (the program's API key), and the traffic is plain "
                          "HTTP (docs/security.md)", stacklevel=2)
        tcp = await start_chat_server(self.server, self.config.host, self.config.port)
        self.port = tcp.sockets[0].getsockname()[1]
        self._listeners.append(tcp)

    async def _listen_unix(self) -> None:
        self._folder = self._folder or tempfile.mkdtemp(prefix="agentrl-endpoint-")
        os.chmod(self._folder, 0o755)
        path = os.path.join(self._folder, f"endpoint-{len(self._listeners)}.sock")
        self._listeners.append(await start_chat_server(self.server, None, None, path))
        os.chmod(path, 0o777)  # a sandboxed program runs as another user
        self.socket_path = path

    def open(self, rollout_id: str, sampling_seed: int | None,
             max_requests: int | None = None) -> HarnessSession:
        """A new session for one rollout, registered under a fresh secret id."""
        session_id = new_session_key(rollout_id)  # the program's API key: unguessable
        rollout = self.rollout
        limits = SessionLimits(max_requests or rollout.max_turns, rollout.max_new_tokens,
                               rollout.max_rollout_tokens)
        stop_ids = stop_ids_of(self.tokenizer)

        def sampling(index: int, request: ChatRequest, max_tokens: int) -> SamplingParams:
            seed = None if sampling_seed is None else sampling_seed + index * 1_000_003
            return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p,
                                  max_tokens=max_tokens, stop_token_ids=stop_ids,
                                  stop=request.stop, seed=seed)

        session = HarnessSession(session_id, self.tokenizer, limits, sampling,
                                 lambda g: generation_versions(g, self.engine))
        session.engine = MeteredEngine(self.engine, session.spend)
        self.server.add(session_id, session)
        return session

    def client_config(self, session: HarnessSession) -> dict[str, str]:
        """What a program is given to reach its session: ``openai.OpenAI(base_url=...,
        api_key=...)`` and the model name its requests must carry."""
        return {"base_url": self.base_url, "api_key": session.session_id,
                "model": self.config.model_name}

    def end(self, session: HarnessSession) -> None:
        """Close a session: its rows are final, later requests are refused."""
        session.close()
        self.server.remove(session.session_id)

    async def close(self) -> None:
        """Stop listening (on the loop it listens on)."""
        self.stop()

    def stop(self) -> None:
        """Stop listening, from the loop or once it no longer runs (a run's end), and
        remove the Unix sockets' folder."""
        self._close_listeners()
        self._loop = self._tcp = self._unix = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            try:
                listener.close()
            except RuntimeError:  # its loop is closed already
                pass
        self._listeners = []


def serving_sessions(engine: Any, tokenizer: Any, rollout: RolloutConfig
                     ) -> Callable[[str], HarnessSession]:
    """Sessions opened on first use, for `agentrl serve` (no training): any id is a
    session, the request's temperature, top_p and seed are honoured (defaults: the
    config's), the config's per-request and per-session token budgets apply."""
    stop_ids = stop_ids_of(tokenizer)

    def sampling(index: int, request: ChatRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=rollout.temperature if request.temperature is None
            else request.temperature, top_p=rollout.top_p if request.top_p is None
            else request.top_p, max_tokens=max_tokens, stop_token_ids=stop_ids,
            stop=request.stop, seed=request.seed)

    def open_session(session_id: str) -> HarnessSession:
        limits = SessionLimits(2**31, rollout.max_new_tokens, 2**62)
        return HarnessSession(session_id, tokenizer, limits, sampling,
                              lambda g: generation_versions(g, engine))

    return open_session

"""The OpenAI-compatible endpoint for agent programs: ``POST /v1/chat/completions`` (and
``GET /v1/models``) served over the engine replicas (docs/harnesses.md).

A request names its *session* (one rollout) in one of three ways, first found wins:

- the URL path: ``/sessions/<id>/v1/chat/completions`` (base URL ``.../sessions/<id>/v1``);
- the header ``X-Agentrl-Session: <id>``;
- the API key: ``Authorization: Bearer <id>`` (what ``OPENAI_API_KEY`` sends).

``GET /v1/agentrl/session`` (same session rules) shows how the session's requests became
rows so far: threads, rows, harness compactions with their reasons, drift.

The session (``ChatSession``; the rollout side's recorder) turns the messages into
prompt ids with the model's chat template and decides the sampling settings; the server
generates token-in/token-out on the engine (the rollout's replica, by the session id as
the routing key), parses tool calls from the text and answers a ``chat.completion`` (or
its server-sent events with ``stream``). Every refusal (no or unknown session, a model
name it does not serve, a malformed request, a budget passed, a prompt the engine will
not take) is answered with OpenAI's error object and reported to the session, whose
rollout becomes invalid with that reason.

A request is refused past ``max_request_bytes`` before it is parsed; a large one (over
:data:`OFFLOAD_BYTES`) is parsed, rendered and tokenized on a worker thread, so one huge
message never stalls the loop the other sessions share (a session's own requests take
turns: its placement is never touched by two threads at once). Sessions opened on first
use (``agentrl serve``) are forgotten after ``session_idle_s`` without a request and
start afresh after ``max_session_requests`` requests, so none grows without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from agentrl.engines.chat_api import (
    ChatError,
    ChatRequest,
    assistant_reply,
    completion_body,
    finish_reason,
    parse_chat_request,
    stream_events,
)
from agentrl.engines.http import Answer, Request, RequestHandler, start_request_server
from agentrl.engines.interface import Generation

SESSION_HEADER = "x-agentrl-session"
SESSION_PATH = re.compile(r"^/sessions/([^/]+)(/v1/.+)$")
ROUTES = {("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
          ("GET", "/v1/agentrl/session")}
OFFLOAD_BYTES = 64 * 2**10
"""Request bodies larger than this are parsed and rendered on a worker thread."""


class ChatSession(Protocol):
    """What the endpoint needs from one rollout's recorder
    (``agentrl.rollout.harness_session.HarnessSession``)."""

    def begin(self, request: ChatRequest) -> Any:
        """A turn with ``prompt_ids`` and ``params``; raises ChatError to refuse."""
        ...

    def finish(self, turn: Any, generation: Generation, reply: dict[str, Any]) -> None:
        """Record what was generated for the turn and the message returned."""
        ...

    def abandon(self, turn: Any) -> None:
        """The turn produced nothing (the client left, the engine failed)."""
        ...

    def refuse(self, error: ChatError) -> None:
        """A request of this session was refused for this reason."""
        ...

    def describe(self) -> dict[str, Any]:
        """How its requests became rows so far (``GET /v1/agentrl/session``)."""
        ...

    engine: Any
    """The engine that serves its requests (a view of the server's that meters them for
    the rollout), or None: the server's own."""


class ChatServer:
    """Routes chat requests to their sessions and generates on ``engine``."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str,
                 open_session: Callable[[str], ChatSession | None] | None = None,
                 max_sessions: int = 4096, max_request_bytes: int = 8 * 2**20,
                 session_idle_s: float = 3600.0, max_session_requests: int = 256,
                 clock: Callable[[], float] = time.monotonic,
                 aliases: tuple[str, ...] = ()) -> None:
        """``model_name``: the model requests name (``/v1/models`` lists it); ``aliases``:
        other names requests may give for it (``agentrl serve``: the training endpoint's
        ``endpoint.model_name``, so one program runs against both); ``open_session(id)``:
        a session for an id not registered with :meth:`add` (None: refuse unknown ids),
        the oldest of those forgotten past ``max_sessions``, any forgotten after
        ``session_idle_s`` seconds without a request, renewed after
        ``max_session_requests`` requests; ``max_request_bytes``: the largest request
        body (413 past it, before parsing)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_names = (model_name, *(a for a in aliases if a != model_name))
        self.open_session = open_session
        self.max_sessions = max_sessions
        self.max_request_bytes = max_request_bytes
        self.session_idle_s = session_idle_s
        self.max_session_requests = max_session_requests
        self.clock = clock
        self.sessions: dict[str, ChatSession] = {}
        self._opened: dict[str, float] = {}
        """Sessions made by ``open_session``: id → when last used."""
        self._locks: dict[str, asyncio.Lock] = {}
        self.num_requests = 0
        self._ids = itertools.count()

    def add(self, session_id: str, session: ChatSession) -> None:
        """Serve requests naming ``session_id`` to ``session``."""
        self.sessions[session_id] = session

    def remove(self, session_id: str) -> None:
        """Stop serving a session (its later requests are refused as unknown)."""
        self.sessions.pop(session_id, None)
        self._opened.pop(session_id, None)
        self._locks.pop(session_id, None)

    def owns(self, target: str) -> bool:
        """Whether a request path is one of this server's routes."""
        path = urllib.parse.urlsplit(target).path
        match = SESSION_PATH.match(path)
        return (match.group(2) if match else path) in {p for _, p in ROUTES}

    async def handle(self, request: Request) -> Answer:
        """Answer one HTTP request (an OpenAI error object for every refusal)."""
        session_id, path = _session_and_path(request)
        if (request.method, path) not in ROUTES:
            return _error(ChatError(404, "unknown_route", f"no route {request.method} {path}; "
                                    "this endpoint serves POST /v1/chat/completions and GET "
                                    "/v1/models"))
        if path == "/v1/models":
            return Answer(200, {"object": "list", "data": [
                {"id": self.model_name, "object": "model", "owned_by": "agentrl"}]})
        session = None
        try:
            session = self._session(session_id)
            if path == "/v1/agentrl/session":
                return Answer(200, session.describe())
            if len(request.body) > self.max_request_bytes:
                raise ChatError(413, "request_too_large", f"the request has "
                                f"{len(request.body)} bytes, over this endpoint's "
                                f"{self.max_request_bytes}; compact the conversation")
            return await self._complete(session, session_id or "", request)
        except ChatError as exc:
            if session is not None:
                session.refuse(exc)
            return _error(exc)

    def _begin(self, session: ChatSession, body: bytes) -> tuple[ChatRequest, Any]:
        """Parse, check and place one request: its ChatRequest and turn."""
        chat = parse_chat_request(_json(body))
        if chat.model not in self.model_names:
            names = " or ".join(repr(n) for n in self.model_names)
            raise ChatError(404, "model_not_found", f"the model {chat.model!r} is not "
                            f"served here; this endpoint serves {names} (the client "
                            "config's model, OPENAI_MODEL)", "model")
        return chat, session.begin(chat)

    def _session(self, session_id: str | None) -> ChatSession:
        if not session_id:
            raise ChatError(401, "missing_session", "no session: give it as the API key "
                            "(OPENAI_API_KEY), the X-Agentrl-Session header or the base URL "
                            "/sessions/<id>/v1 (docs/harnesses.md)",
                            kind="authentication_error")
        session = self.sessions.get(session_id)
        if session_id in self._opened and getattr(
                session, "num_requests", 0) >= self.max_session_requests:
            session = None  # a served session starts afresh rather than grow
        if session is None and self.open_session is not None:
            self._forget_idle()
            session = self.open_session(session_id)
            if session is not None:
                self.sessions.pop(session_id, None)
                self.sessions[session_id] = session
                self._opened[session_id] = self.clock()
                if len(self.sessions) > self.max_sessions:
                    self.remove(next(iter(self.sessions)))
        if session_id in self._opened:
            self._opened[session_id] = self.clock()
        if session is None:
            raise ChatError(401, "unknown_session", f"no session {session_id!r} is open "
                            "here (its rollout ended, or the key is not one agentrl gave)",
                            kind="authentication_error")
        return session

    def _forget_idle(self) -> None:
        """Drop opened sessions unused for ``session_idle_s``."""
        now = self.clock()
        for session_id, used in list(self._opened.items()):
            if now - used > self.session_idle_s:
                self.remove(session_id)

    async def _complete(self, session: ChatSession, session_id: str,
                        request: Request) -> Answer:
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:  # a session's placements never run on two threads at once
            if len(request.body) > OFFLOAD_BYTES:
                chat, turn = await asyncio.to_thread(self._begin, session, request.body)
            else:
                chat, turn = self._begin(session, request.body)
        engine = getattr(session, "engine", None) or self.engine
        work = asyncio.ensure_future(engine.generate(turn.prompt_ids, turn.params,
                                                     key=session_id))
        gone = asyncio.ensure_future(request.disconnected())
        try:
            await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        async with lock:
            return self._reply(session, chat, turn, work)

    def _reply(self, session: ChatSession, chat: ChatRequest, turn: Any,
               work: asyncio.Future) -> Answer:
        """Record the generation (or the turn's end without one) and answer it."""
        if not work.done():  # the client went away: drop its generation
            work.cancel()
            session.abandon(turn)
            return Answer(499, ChatError(499, "client_closed", "client closed the "
                                         "request").body())
        try:
            generation = work.result()
        except ValueError as exc:
            session.abandon(turn)
            raise ChatError(400, "context_length_exceeded", f"the engine refused the "
                            f"prompt of {len(turn.prompt_ids)} tokens: {exc}") from exc
        except ConnectionError as exc:
            session.abandon(turn)
            raise ChatError(503, "engine_unavailable", f"engine replica unavailable: {exc}",
                            kind="server_error") from exc
        except Exception as exc:  # the turn ends here rather than stay busy forever
            session.abandon(turn)
            raise ChatError(500, "engine_error", f"the engine failed: {type(exc).__name__}: "
                            f"{exc}", kind="server_error") from exc
        self.num_requests += 1
        body = self._body(chat, turn, generation)
        session.finish(turn, generation, body["choices"][0]["message"])
        if chat.stream:
            return Answer(200, events=_iterate(stream_events(body, chat.include_usage)))
        return Answer(200, body)

    def _body(self, chat: ChatRequest, turn: Any, generation: Generation) -> dict[str, Any]:
        ids = generation.token_ids
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] in
                                     turn.params.stop_token_ids else ids)
        for stop in chat.stop:  # OpenAI's answer ends before the stop sequence
            text = text.split(stop, 1)[0]
        number = next(self._ids)
        reply = assistant_reply(text, (f"call_{number}_{i}" for i in itertools.count()))
        usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(turn.prompt_ids) + len(ids)}
        logprobs = None
        if chat.logprobs:
            logprobs = [{"token": (piece := self.tokenizer.decode([t])), "logprob": lp,
                         "bytes": list(piece.encode()), "top_logprobs": []}
                        for t, lp in zip(ids, generation.logprobs, strict=True)]
        return completion_body(f"chatcmpl-agentrl-{number}", self.model_name, reply,
                               finish_reason(reply, generation.finish_reason), usage, logprobs)


def routed(chat: ChatServer, fallback: RequestHandler) -> RequestHandler:
    """One handler for a port shared with another server: chat routes go to ``chat``."""

    async def handle(request: Request) -> Answer:
        if chat.owns(request.target):
            return await chat.handle(request)
        return await fallback(request)

    return handle


async def start_chat_server(server: ChatServer, host: str | None, port: int | None,
                            unix_path: str | None = None) -> asyncio.Server:
    """Listen for the endpoint's requests (on TCP, or on a Unix socket)."""
    return await start_request_server(server.handle, host, port, unix_path)


def serve_on_thread(server: ChatServer, host: str = "127.0.0.1"
                    ) -> tuple[asyncio.AbstractEventLoop, int]:
    """Serve the endpoint from an event loop on a daemon thread of its own, on a free TCP
    port (for a bench or a test that talks to it from this thread); the loop and port.
    ``loop.call_soon_threadsafe(loop.stop)`` stops it."""
    import threading

    loop, ready, port = asyncio.new_event_loop(), threading.Event(), []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        listener = loop.run_until_complete(start_chat_server(server, host, 0))
        port.append(listener.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True, name="chat-endpoint").start()
    if not ready.wait(60):
        raise RuntimeError("the chat endpoint did not start listening within 60 s")
    return loop, port[0]


def _session_and_path(request: Request) -> tuple[str | None, str]:
    path = urllib.parse.urlsplit(request.target).path
    match = SESSION_PATH.match(path)
    if match:
        return urllib.parse.unquote(match.group(1)), match.group(2)
    if request.headers.get(SESSION_HEADER):
        return request.headers[SESSION_HEADER], path
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None, path


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except (ValueError, RecursionError) as exc:
        raise ChatError(400, "invalid_json", f"the request body is not JSON: {exc}") from None


def _error(error: ChatError) -> Answer:
    return Answer(error.status, error.body())


async def _iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk

"""A token-checking reverse proxy in front of a server that has no authentication of its
own: ``agentrl serve`` runs vLLM (whose RL routes, ``VLLM_SERVER_DEV_MODE``, change
weights unauthenticated) on loopback and faces the network with this proxy, which checks
the run's shared token and the request limits of ``agentrl.engines.http`` before a byte
reaches vLLM, then streams vLLM's answer back unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agentrl.engines.auth import TOKEN_HEADER, TokenGate, presented_token
from agentrl.engines.http import (
    DEFAULT_LIMITS,
    Answer,
    Request,
    RequestHandler,
    ServerLimits,
    split_url,
    start_request_server,
)

DROPPED_HEADERS = {TOKEN_HEADER, "host", "content-length", "transfer-encoding", "connection",
                   "keep-alive", "upgrade", "proxy-connection", "te", "trailer"}
"""Headers not forwarded: the token, and those that describe one hop."""


def forwarder(upstream_url: str, token: str | None) -> RequestHandler:
    """A handler sending each (already checked) request to ``upstream_url`` and streaming
    its answer back; the token is never forwarded."""
    host, port = split_url(upstream_url)

    async def forward(request: Request) -> Answer:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            return Answer(502, {"error": f"the server behind this proxy ({upstream_url}) is "
                                f"unreachable: {exc}"})
        headers = {k: v for k, v in request.headers.items() if k not in DROPPED_HEADERS}
        if token and presented_token(request.headers) == token:
            headers.pop("authorization", None)  # the bearer was our token, not theirs
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"{request.method} {request.target} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"{head}Content-Length: {len(request.body)}\r\nConnection: close\r\n\r\n"
                     .encode() + request.body)
        await writer.drain()
        return Answer(0, raw=_relay(reader, writer))

    return forward


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                 ) -> AsyncIterator[bytes]:
    """The upstream answer's bytes as they come; the upstream connection closed at the end
    (or when the client leaves)."""
    try:
        while data := await reader.read(2**16):
            yield data
    finally:
        writer.close()


async def start_proxy(upstream_url: str, host: str, port: int, token: str | None,
                      limits: ServerLimits = DEFAULT_LIMITS) -> asyncio.Server:
    """Listen on ``host:port`` and forward every request the token and limits allow to
    ``upstream_url``."""
    return await start_request_server(forwarder(upstream_url, token), host, port,
                                      limits=limits, gate=TokenGate(token, "agentrl serve"))

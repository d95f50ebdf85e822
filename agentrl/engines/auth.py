"""Who may use a server agentrl starts (docs/security.md, "Network").

Every server listens on loopback unless the user names another address. Off loopback,
every route that changes state or spends compute needs the run's shared token: a secret
read from a file (``--token-file``, ``AGENTRL_TOKEN_FILE``) or the environment
(``AGENTRL_TOKEN``), never from the command line (where ``ps`` shows it). Clients send it
as ``X-Agentrl-Token: TOKEN`` (or ``Authorization: Bearer TOKEN``); the server compares
it in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import sys
from typing import Any

from agentrl.config.token import (  # noqa: F401 - the token's one home, re-exported here
    MIN_TOKEN_CHARS,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    load_token,
    token_headers,
)

TOKEN_HEADER = "x-agentrl-token"
OPEN_ROUTES = {("GET", "/health")}
"""Routes answered without the token: liveness only."""


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address or name (``""``, ``0.0.0.0`` and ``::``,
    every interface, are not)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def presented_token(headers: dict[str, str]) -> str:
    """The token a request carries (lower-case header names), or ""."""
    if headers.get(TOKEN_HEADER):
        return headers[TOKEN_HEADER].strip()
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class TokenGate:
    """The check a server runs on each request: with a token, every route but
    :data:`OPEN_ROUTES` needs it; refusals are logged once, then counted."""

    def __init__(self, token: str | None, server: str) -> None:
        """``server``: its name in the log line."""
        self.token = token
        self.server = server
        self.num_refused = 0

    def allows(self, method: str, path: str, headers: dict[str, str]) -> bool:
        """Whether the request may proceed (constant-time comparison)."""
        if self.token is None or (method, path) in OPEN_ROUTES:
            return True
        good = hmac.compare_digest(presented_token(headers).encode(), self.token.encode())
        if not good:
            if self.num_refused == 0:
                print(f"warning: {self.server}: refused a request without the shared "
                      f"token ({method} {path}); further refusals are counted, not logged",
                      file=sys.stderr, flush=True)
            self.num_refused += 1
        return good


def check_bind(host: str, token: str | None, server: str, reachable: str) -> None:
    """Refuse to listen off loopback without a token; warn, naming what becomes reachable,
    when listening off loopback with one."""
    if is_loopback(host):
        return
    if token is None:
        raise ValueError(f"{server} --host {host or '(all interfaces)'} would offer "
                         f"{reachable} to the network without authentication; set "
                         f"${TOKEN_ENV} or --token-file (docs/security.md), or keep the "
                         "default --host 127.0.0.1")
    print(f"warning: {server} listens on {host or 'all interfaces'}: {reachable} is "
          "reachable from the network by anyone holding the token (plain HTTP: put a TLS "
          "reverse proxy in front across untrusted networks)", file=sys.stderr, flush=True)


def connectable_host(host: str) -> str:
    """An address a client can connect to for a server bound to ``host``: the machine's
    own address for every interface (``0.0.0.0``, ``::``, ``""``)."""
    if host not in ("", "0.0.0.0", "::"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def guard_asgi(app: Any, gate: TokenGate) -> Any:
    """An ASGI app that lets through only requests and WebSocket sessions ``gate``
    allows (401, or the WebSocket closed with policy violation 1008, otherwise)."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", [])}
            if not gate.allows(scope.get("method", "GET"), scope.get("path", ""), headers):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body",
                            "body": b'{"error": "this server needs the run\'s shared token '
                                    b'(X-Agentrl-Token header; docs/security.md)"}'})
                return
        await app(scope, receive, send)

    return guarded

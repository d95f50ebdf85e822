"""The little HTTP/1.1 this package needs, on the standard library: an asyncio client for
many concurrent generation requests, a blocking JSON client for the weight-sync control
plane, and an asyncio server (JSON answers, or server-sent events for streamed ones; on
TCP or a Unix socket). One request per connection (``Connection: close``): simple,
and a cancelled request closes its socket, which tells the server to drop the work.
Every call has a timeout; a failure raises :class:`ReplicaUnavailableError` naming the URL.
"""

from __future__ import annotations

import asyncio
import json
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from agentrl.engines.auth import TokenGate, token_headers

MAX_BODY_BYTES = 64 * 2**20
"""Largest request or response body accepted (JSON: token ids, control messages)."""


class ReplicaUnavailableError(ConnectionError):
    """A replica could not be reached or did not answer in time; names its URL."""


class HTTPError(RuntimeError):
    """The replica answered with an error status; the message carries its explanation."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(f"{url} answered {status}: {detail}")
        self.status = status


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of an ``http://host:port`` base URL; ValueError naming it otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"engine URL {url!r}: use http://HOST:PORT (e.g. "
                         "http://10.0.0.2:8000), as printed by `agentrl serve`")
    return parts.hostname, parts.port


async def request_json(url: str, path: str, payload: Any | None, timeout_s: float,
                       token: str | None = None) -> Any:
    """POST ``payload`` as JSON (GET when None) to ``url + path`` and return the decoded
    JSON answer, within ``timeout_s`` seconds in all; ``token``: the run's shared token
    (``agentrl.engines.auth``), sent when given."""
    host, port = split_url(url)
    body = b"" if payload is None else json.dumps(payload).encode()
    method = "GET" if payload is None else "POST"
    try:
        status, data = await asyncio.wait_for(
            _exchange(host, port, method, path, body, token), timeout_s)
    except TimeoutError:
        raise ReplicaUnavailableError(
            f"{url}{path} did not answer within {timeout_s:g} s") from None
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        raise ReplicaUnavailableError(f"{url}{path} unreachable: {exc}") from exc
    return _decode(url + path, status, data)


async def _exchange(host: str, port: int, method: str, path: str, body: bytes,
                    token: str | None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        auth = "".join(f"{k}: {v}\r\n" for k, v in token_headers(token).items())
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        writer.write(head.encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
        headers = await _read_headers(reader)
        return int(parts[1]), await _read_body(reader, headers, until_eof=True)
    finally:
        writer.close()


async def _read_headers(reader: asyncio.StreamReader, max_headers: int = 1000,
                        max_bytes: int = 2**20) -> dict[str, str]:
    """Header lines until the blank one; ValueError past ``max_headers`` lines or
    ``max_bytes`` bytes."""
    headers: dict[str, str] = {}
    num_bytes = 0
    for _ in range(max_headers + 1):
        line = await reader.readline()
        num_bytes += len(line)
        if num_bytes > max_bytes:
            raise ValueError(f"headers over {max_bytes} bytes")
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise ValueError(f"over {max_headers} header lines")


class BodyTooLarge(ValueError):
    """A body over the size limit."""


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str],
                     until_eof: bool, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The body (Content-Length, chunked, or until EOF); BodyTooLarge past ``max_bytes``
    (checked before reading it, or chunk by chunk), ValueError when malformed."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks, total = [], 0
        while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
            total += size
            if size < 0 or total > max_bytes:
                raise BodyTooLarge(f"chunked body over the {max_bytes}-byte limit")
            chunks.append(await reader.readexactly(size))
            await reader.readline()
        await reader.readline()
        return b"".join(chunks)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length < 0:
            raise ValueError(f"Content-Length {length} is negative")
        if length > max_bytes:
            raise BodyTooLarge(f"body of {length} bytes is over the {max_bytes}-byte limit")
        return await reader.readexactly(length)
    if not until_eof:
        return b""
    data = await reader.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BodyTooLarge(f"body over the {max_bytes}-byte limit")
    return data


def _decode(where: str, status: int, data: bytes) -> Any:
    try:
        answer = json.loads(data) if data else {}
    except json.JSONDecodeError:
        answer = {"error": data[:300].decode("utf-8", "replace")}
    if status >= 400:
        raise HTTPError(where, status, _error_text(answer))
    return answer


def _error_text(answer: Any) -> str:
    if isinstance(answer, dict):
        error = answer.get("error", answer.get("detail", answer))
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(answer)


def post_json_blocking(url: str, path: str, payload: Any | None, timeout_s: float,
                       method: str = "POST", token: str | None = None) -> Any:
    """The blocking twin of :func:`request_json` (for the weight-sync threads)."""
    split_url(url)
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **token_headers(token)})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return _decode(url + path, response.status, response.read())
    except urllib.error.HTTPError as exc:
        return _decode(url + path, exc.code, exc.read())
    except TimeoutError:
        raise ReplicaUnavailableError(
            f"{url}{path} did not answer within {timeout_s:g} s") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ReplicaUnavailableError(f"{url}{path} unreachable: {exc}") from exc


# ----------------------------------------------------------------------------- server

Handler = Callable[[str, str, Any, Callable[[], Awaitable[None]]], Awaitable[tuple[int, Any]]]
"""(method, path with query, decoded JSON body or None, wait_for_disconnect) →
(status, JSON-able answer)."""


class Request(NamedTuple):
    """One HTTP request as a :data:`RequestHandler` sees it."""

    method: str
    target: str
    """The path with its query."""
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes
    disconnected: Callable[[], Awaitable[None]]
    """Returns once the client has closed its socket (it gave up)."""


class Answer(NamedTuple):
    """What a :data:`RequestHandler` answers: a JSON body, a stream of server-sent
    events (``text/event-stream``, sent chunked as the iterator yields them), or the raw
    bytes of a whole HTTP answer (a proxy's, status line included)."""

    status: int
    payload: Any = None
    events: AsyncIterator[bytes] | None = None
    raw: AsyncIterator[bytes] | None = None


RequestHandler = Callable[[Request], Awaitable[Answer]]


async def start_server(handler: Handler, host: str, port: int) -> asyncio.Server:
    """An asyncio HTTP server answering every request with ``handler``'s JSON."""
    return await start_request_server(json_handler(handler), host, port)


def json_handler(handler: Handler) -> RequestHandler:
    """A :data:`RequestHandler` calling a JSON :data:`Handler` with the decoded body."""

    async def adapt(request: Request) -> Answer:
        try:
            payload = json.loads(request.body) if request.body else None
        except (ValueError, RecursionError) as exc:
            return Answer(400, {"error": f"bad request body: {exc}"})
        return Answer(*await handler(request.method, request.target, payload,
                                     request.disconnected))

    return adapt


def _half_fd_limit() -> int:
    """Half the process's open-file limit (at least 64): connections a server accepts at
    once, leaving the rest to the run's other sockets and files."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(64, (soft if soft != resource.RLIM_INFINITY else 2**16) // 2)


class ServerLimits(NamedTuple):
    """What one client may cost a server before its request is answered or refused."""

    read_timeout_s: float = 60.0
    """Seconds to send the request line, headers and body (a slow client is answered 408
    and closed, never waited for)."""
    max_connections: int = _half_fd_limit()
    """Connections open at once (default: half the open-file limit, 512 under the common
    1,024); one more is answered 503 and closed, so the process never runs out of fds."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Body bytes, by Content-Length or chunked (413 past it)."""
    max_header_bytes: int = 64 * 2**10
    """Request line and headers together, and each line (431 past it)."""
    max_headers: int = 100
    """Header lines (431 past it)."""


DEFAULT_LIMITS = ServerLimits()


class Refusal(NamedTuple):
    """A request refused before its handler runs: status and reason."""

    status: int
    reason: str


async def start_request_server(handler: RequestHandler, host: str | None, port: int | None,
                               unix_path: str | None = None,
                               limits: ServerLimits = DEFAULT_LIMITS,
                               gate: TokenGate | None = None) -> asyncio.Server:
    """An asyncio HTTP server that hands ``handler`` each whole request (headers and raw
    body); on TCP ``host:port``, or on the Unix socket ``unix_path`` when given. Requests
    past ``limits`` are refused with a 4xx; with a ``gate``, one without the token gets
    401 before its body is read; a handler that raises answers 500, never a dropped
    connection."""
    num_open = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal num_open
        num_open += 1
        try:
            if num_open > limits.max_connections:
                answer = Answer(503, {"error": f"over {limits.max_connections} connections "
                                      "at once; retry later"})
            else:
                answer = await _answer(reader, handler, limits, gate)
            await _write_answer(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        finally:
            num_open -= 1
            writer.close()

    if unix_path is not None:
        return await asyncio.start_unix_server(serve, unix_path, limit=limits.max_header_bytes)
    return await asyncio.start_server(serve, host, port, limit=limits.max_header_bytes)


async def _answer(reader: asyncio.StreamReader, handler: RequestHandler,
                  limits: ServerLimits, gate: TokenGate | None) -> Answer:
    """Read one request within the limits and answer it (or the refusal)."""
    try:
        request = await asyncio.wait_for(_read_request(reader, limits, gate),
                                         limits.read_timeout_s)
    except TimeoutError:
        return Answer(408, {"error": f"the request did not arrive within "
                            f"{limits.read_timeout_s:g} s"})
    if isinstance(request, Refusal):
        return Answer(request.status, {"error": {"message": request.reason,
                                                 "type": _ERROR_TYPES.get(request.status,
                                                                          "invalid_request_error"),
                                                 "param": None, "code": None}})
    try:
        return await handler(request)
    except Exception as exc:  # a bug answers this request alone, with its reason
        traceback.print_exc()
        return Answer(500, {"error": f"{type(exc).__name__}: {exc}"})


async def _read_request(reader: asyncio.StreamReader, limits: ServerLimits,
                        gate: TokenGate | None) -> Request | Refusal:
    """The request, or why it is refused (malformed, too large, no token)."""
    try:
        request_line = (await reader.readline()).decode("latin-1").split()
        if len(request_line) < 2:
            return Refusal(400, "malformed request line")
        headers = await _read_headers(reader, limits.max_headers, limits.max_header_bytes)
    except ValueError as exc:  # a line over the reader's limit, too many headers
        return Refusal(431, f"request head too large: {exc}")
    method, target = request_line[0], request_line[1]
    if gate is not None and not gate.allows(method, urllib.parse.urlsplit(target).path,
                                            headers):
        return Refusal(401, "this server needs the run's shared token (X-Agentrl-Token "
                            "header; docs/security.md)")
    try:
        body = await _read_body(reader, headers, until_eof=False,
                                max_bytes=limits.max_body_bytes)
    except BodyTooLarge as exc:
        return Refusal(413, str(exc))
    except ValueError as exc:
        return Refusal(400, f"bad request body: {exc}")

    async def disconnected() -> None:  # the client closes its socket when it gives up
        while await reader.read(2**16):  # what it sends meanwhile is dropped, not kept
            pass

    return Request(method, target, headers, body, disconnected)


async def _write_answer(writer: asyncio.StreamWriter, answer: Answer) -> None:
    if answer.raw is not None:
        async for data in answer.raw:
            writer.write(data)
            await writer.drain()
        return
    reason = _REASONS.get(answer.status, "Error")
    if answer.events is None:
        data = json.dumps(answer.payload).encode()
        writer.write(f"HTTP/1.1 {answer.status} {reason}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     "Connection: close\r\n\r\n".encode() + data)
        await writer.drain()
        return
    writer.write(f"HTTP/1.1 {answer.status} {reason}\r\nContent-Type: text/event-stream\r\n"
                 "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                 "Connection: close\r\n\r\n".encode())
    async for chunk in answer.events:
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 408: "Request Timeout", 409: "Conflict",
            413: "Content Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}
_ERROR_TYPES = {401: "authentication_error", 503: "server_error"}

"""What an attacker on the same machine uses against agentrl's servers: raw sockets, a
server on a thread with chosen limits, a listener that records who connects."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

from agentrl.engines.http import Answer, ServerLimits, start_request_server

TOKEN = "attack-test-token-0123456789abcdef"


def raw_exchange(port: int, data: bytes, timeout_s: float = 30.0) -> tuple[int, Any]:
    """Send ``data`` as is to 127.0.0.1:``port``; the answer's (status, JSON body); status
    0 when the server closed the connection without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking it all
        return read_answer(sock)


def read_answer(sock: socket.socket) -> tuple[int, Any]:
    """(status, JSON body) of the answer on ``sock`` (0, None when there is none)."""
    chunks = []
    try:
        while chunk := sock.recv(2**16):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    answer = b"".join(chunks)
    if not answer:
        return 0, None
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else None


def post(path: str, body: bytes | str, headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 POST with this exact body text."""
    data = body.encode() if isinstance(body, str) else body
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


class LimitedServer:
    """A request server answering 200 {"ok": true} (after reading the whole request), on
    its own loop and thread, with the given limits."""

    def __init__(self, limits: ServerLimits) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()

        async def handler(request: Any) -> Answer:
            return Answer(200, {"ok": True, "bytes": len(request.body)})

        async def start() -> None:
            self.server = await start_request_server(handler, "127.0.0.1", 0, limits=limits)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10), "the server did not start"

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)

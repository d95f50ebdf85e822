"""Starting ``agentrl serve`` processes on this machine (tests, benchmarks, one-box runs)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY = "agentrl serve:"
"""The line a server prints once it listens: "agentrl serve: MODEL on http://HOST:PORT ..."."""


@dataclass
class ServerProcess:
    """One running ``agentrl serve`` and the URL it answers on."""

    proc: subprocess.Popen
    url: str = ""
    output: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Terminate it (kill after 30 s)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn_servers(config: str | Path, count: int, threads: int = 1, host: str = "127.0.0.1",
                  timeout_s: float = 180.0, overrides: tuple[str, ...] = ()
                  ) -> list[ServerProcess]:
    """Start ``count`` servers of ``config`` on free ports, all at once; return when each
    listens. A server that exits or stays silent past ``timeout_s`` raises with its output
    (the others are stopped)."""
    command = [sys.executable, "-m", "agentrl.cli", "serve", str(config), "--host", host,
               "--port", "0", "--threads", str(threads)]
    for override in overrides:
        command += ["--set", override]
    servers = [ServerProcess(subprocess.Popen(command, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
               for _ in range(count)]
    try:
        deadline = time.monotonic() + timeout_s
        for server in servers:
            server.url = _wait_for_url(server, deadline)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _wait_for_url(server: ServerProcess, deadline: float) -> str:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:  # keeps draining the pipe so the server never blocks on it
        for line in server.proc.stdout:  # type: ignore[union-attr]
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if server.proc.poll() is not None and lines.empty():
                break
            continue
        server.output.append(line)
        if line.startswith(READY):
            return line.split(" on ", 1)[1].split()[0]
    raise RuntimeError("agentrl serve did not start (exit status "
                       f"{server.proc.poll()}):\n" + "".join(server.output[-30:]))

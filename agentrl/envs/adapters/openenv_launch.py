"""Starting an OpenEnv server on this machine: from a command, or from an installed
OpenEnv environment package.

A server is started once per process for each (command, folder) and shared by every
session of that process (one per concurrent rollout). ``{port}`` in the command is
replaced by a free port; the server is ready once ``GET /health`` answers. It is stopped
when the process exits, and Linux stops it (SIGTERM) when the process dies however it
dies, a SIGKILLed trainer included: the servers are started by one long-lived thread, since
the kernel's parent-death signal follows the thread that started the child.
"""

from __future__ import annotations

import atexit
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.envs.adapters.remote import RemoteEnvError
from agentrl.envs.harness import own_python

HOST = "127.0.0.1"
_servers: dict[tuple[tuple[str, ...], str], tuple[subprocess.Popen, str]] = {}
_lock = threading.Lock()
_requests: queue.Queue = queue.Queue()
_launcher: threading.Thread | None = None


def free_port() -> int:
    """A TCP port free right now on the loopback address."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def command_argv(command: str | Sequence[str], port: int) -> list[str]:
    """The command as argv, ``{port}`` replaced; ``python`` means this interpreter."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("command is empty; give the command that starts the server, e.g. "
                         "'python -m uvicorn server.app:app --port {port}'")
    if not any("{port}" in a for a in argv):
        raise ValueError(f"command {shlex.join(argv)!r} has no {{port}}: agentrl picks a free "
                         "port and puts it there, e.g. '... --port {port}'")
    return [a.replace("{port}", str(port)) for a in own_python(argv)]


def package_command(name: str) -> list[str]:
    """The command that serves an installed OpenEnv environment package (found by
    OpenEnv's own discovery of ``openenv-*`` distributions) with uvicorn."""
    from agentrl.config.extras import require

    discovery = require("openenv.auto._discovery", "an installed OpenEnv environment")
    environments = discovery.EnvironmentDiscovery().discover(use_cache=False)
    key = name.removesuffix("_env").removesuffix("-env")
    info = environments.get(key)
    if info is None:
        found = ", ".join(sorted(e.name for e in environments.values())) or "none"
        raise ValueError(f"no installed OpenEnv environment {name!r} (installed: {found}); "
                         f"install its package (pip install openenv-{key}_env, or the "
                         "environment's folder), or give url= or command=")
    module = info.client_module_path.rpartition(".")[0]
    app = (info.manifest or {}).get("app", "server.app:app")
    return [sys.executable, "-m", "uvicorn", f"{module}.{app}", "--host", HOST,
            "--port", "{port}"]


def local_server(command: str | Sequence[str], cwd: str | Path | None,
                 start_timeout_s: float) -> str:
    """The URL of this process's server for the command, started (and waited for) the
    first time; raises RemoteEnvError ``env_unreachable`` when it does not come up."""
    folder = str(Path(cwd).resolve()) if cwd else os.getcwd()
    key = (tuple(shlex.split(command) if isinstance(command, str) else command), folder)
    with _lock:
        known = _servers.get(key)
        if known is not None and known[0].poll() is None:
            return known[1]
        port = free_port()
        argv = command_argv(command, port)
        proc = _start(argv, folder)
        url = f"http://{HOST}:{port}"
        try:
            wait_healthy(url, proc, start_timeout_s, shlex.join(argv))
        except RemoteEnvError as exc:
            stop(proc)
            raise RemoteEnvError(exc.kind, f"{exc}; its output ends:\n{_tail(proc)}") from None
        except BaseException:
            stop(proc)
            raise
        _servers[key] = (proc, url)
        return url


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float,
                 what: str = "the server") -> None:
    """Poll ``GET /health`` until it answers 200; the process exiting first is an error."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RemoteEnvError("env_unreachable", f"{what} exited with status "
                                 f"{proc.returncode} before answering on {url}/health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RemoteEnvError("env_unreachable", f"{what} did not answer on {url}/health within "
                         f"{timeout_s:g} s (start_timeout_s)")


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server (kill after 10 s)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_all() -> None:
    """Stop every server this process started (at exit)."""
    with _lock:
        for proc, _ in _servers.values():
            stop(proc)
        _servers.clear()


atexit.register(stop_all)


def _start(argv: list[str], cwd: str) -> subprocess.Popen:
    """Start the server from the launcher thread (it lives as long as the process)."""
    global _launcher
    if _launcher is None or not _launcher.is_alive():
        _launcher = threading.Thread(target=_launch_loop, name="openenv-launcher", daemon=True)
        _launcher.start()
    reply: queue.Queue = queue.Queue()
    _requests.put((argv, cwd, reply))
    ok, value = reply.get()
    if not ok:
        raise RemoteEnvError("env_unreachable", f"cannot start {shlex.join(argv)!r} in "
                             f"{cwd}: {value}")
    return value


def _launch_loop() -> None:
    while True:
        argv, cwd, reply = _requests.get()
        try:
            log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's output, for errors
            proc: Any = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
            proc.agentrl_log = log
            reply.put((True, proc))
        except OSError as exc:
            reply.put((False, exc))


def _tail(proc: Any, lines: int = 15) -> str:
    log = getattr(proc, "agentrl_log", None)
    if log is None:
        return "(no output)"
    log.seek(0)
    return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:]) or "(nothing)"


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when the thread that started it exits."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the server is stopped at exit only

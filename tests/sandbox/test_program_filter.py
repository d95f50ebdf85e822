"""The harness sandbox's program confinement on its own (no bubblewrap needed): the
forwarder starts the program under the seccomp filter and limits, which refuse a Unix
socket and io_uring and let everything else through."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from agentrl.sandbox.program import FORWARDER
from agentrl.sandbox.seccomp import ARCHES, unix_socket_filter
from agentrl.sandbox.types import SandboxUnavailableError

PROBE = r"""
import ctypes, errno, resource, socket
seen = []
try:
    socket.socket(socket.AF_UNIX)
    seen.append("unix")
except PermissionError:
    pass
socket.socketpair()
seen.append("pair")
socket.socket(socket.AF_INET).close()
seen.append("inet")
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(425, 8, ctypes.create_string_buffer(120)) == -1:  # io_uring_setup
    seen.append(errno.errorcode[ctypes.get_errno()])
seen.append(str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
print(" ".join(seen))
"""


@pytest.mark.skipif(platform.machine() not in ARCHES, reason="no filter for this machine")
def test_the_program_may_not_create_a_unix_socket_nor_use_io_uring() -> None:
    confinement = {"filter": unix_socket_filter().hex(), "files": 100, "processes": 200,
                   "connections": 4}
    result = subprocess.run([sys.executable, "-I", "-c", FORWARDER, "/nonexistent.sock", "0",
                             json.dumps(confinement), sys.executable, "-c", PROBE],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["pair", "inet", "EPERM", "100"]


def test_an_unknown_machine_gets_no_filter_and_says_so() -> None:
    with pytest.raises(SandboxUnavailableError, match="no socket filter for 'mips'"):
        unix_socket_filter("mips")

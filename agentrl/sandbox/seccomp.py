"""A seccomp filter that keeps an agent program off every host Unix socket.

A read-only bind mount does not stop ``connect()`` on a socket file: any world-writable
socket the sandbox can see would take the program's bytes. Rather than guess where sockets
live, the program may not create a Unix socket at all: ``socket(AF_UNIX, ...)`` fails with
EPERM (``socketpair`` still works: it reaches nothing outside). io_uring, which could make
sockets past the filter, is refused the same way, and a syscall of another ABI (x32, i386
compat) kills the process. The endpoint stays reachable through the forwarder, which runs
outside the filter (docs/security.md).
"""

from __future__ import annotations

import errno
import platform
import struct

from agentrl.sandbox.types import SandboxUnavailableError

AF_UNIX = 1
ARCHES = {  # machine: (AUDIT_ARCH_*, socket's syscall number)
    "x86_64": (0xC000003E, 41),
    "aarch64": (0xC00000B7, 198),
}
IO_URING = (425, 426, 427)
"""io_uring_setup, io_uring_enter, io_uring_register (the same numbers on every arch)."""
X32_BIT = 0x40000000

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO


def unix_socket_filter(machine: str | None = None) -> bytes:
    """The filter's ``struct sock_filter`` array for ``machine`` (default: this one);
    SandboxUnavailableError on an architecture it does not know."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SandboxUnavailableError(f"harness.sandbox = true: no socket filter for "
                                      f"{machine!r} (known: {sorted(ARCHES)})")
    arch, socket_nr = ARCHES[machine]
    # (code, jump if true, jump if false, k); jumps count the instructions skipped
    program = [
        (_LD_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, KILL_PROCESS),
        (_LD_ABS, 0, 0, 0),  # seccomp_data.nr
        (_JGE, 7, 0, X32_BIT),
        *[(_JEQ, 6 - i, 0, nr) for i, nr in enumerate(IO_URING)],
        (_JEQ, 0, 2, socket_nr),
        (_LD_ABS, 0, 0, 16),  # the low 32 bits of args[0], the address family
        (_JEQ, 1, 0, AF_UNIX),
        (_RET, 0, 0, ALLOW),
        (_RET, 0, 0, DENY),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)

"""Red team: escape attempts against the bubblewrap sandbox, each checked from the host.

Every attempt runs WITHOUT the audit hook (``audit_hook=False``), so what holds is the
operating system alone; the ``hook-*`` attempts run WITH it and first defeat it the ways
that worked against the old sandbox. After every attempt ``Host.assert_intact`` checks all
witnesses on the host (secret not in the output, listeners untouched, host processes
alive, untraced and unsignalled, no file created or changed, hostname and core_pattern
unchanged, nothing of the run still running); each attempt adds its own check on top.
Code prints "LEAK" only at the point where its sensitive effect would have happened.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from string import Template

import pytest

from agentrl.sandbox import SandboxLimits, SandboxResult, run_python

RED = SandboxLimits(cpu_s=2, wall_s=4.0, memory_mb=256, max_output_bytes=4000,
                    max_file_bytes=100_000, max_processes=8, scratch_mb=4)
SHORT = SandboxLimits(cpu_s=30, wall_s=2.5, memory_mb=256, max_output_bytes=4000,
                      max_file_bytes=100_000, max_processes=8, scratch_mb=4)

SLACK_S = 4.0
"""How long after its wall clock a killed call may take to come back on a busy machine."""

# CPU time is counted per process over all its threads; on a busy machine the wall clock
# may come first
SPIN = SandboxLimits(cpu_s=1, wall_s=1.5, memory_mb=256, max_processes=8, scratch_mb=4)

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
ERRNO = "print('errno', ctypes.get_errno())\n"
EPERM, EACCES, EINVAL, ENOSPC, ENOSYS = 1, 13, 22, 28, 38

# Start a process whose command line carries the marker (so the host can look for it),
# detached as a daemon: new session, double fork. The run waits until it is running.
DAEMON = """
import os, signal, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        os.execv('$python', ['$python', '-c', 'import time; time.sleep(120)', '$marker'])
    os.write(w, str(pid).encode())
    os._exit(0)
os.close(w)
pid = int(os.read(r, 20))
while '$marker' not in open(f'/proc/{pid}/cmdline').read():
    time.sleep(0.01)
print('daemon running', pid, flush=True)
"""


@dataclass
class Attempt:
    name: str
    code: str
    check: Callable[[SandboxResult, float], None] | None = None
    """Extra assertions on the result and the seconds it took."""
    hook: bool = False
    limits: SandboxLimits = field(default=RED)


def printed(result: SandboxResult, label: str) -> int:
    """The number the attempt printed after ``label``."""
    match = re.search(rf"^{label} (-?\d+)", result.stdout, re.M)
    assert match, f"the attempt did not report {label!r}: {result.stdout!r} {result.stderr!r}"
    return int(match.group(1))


def errno_in(*allowed: int) -> Callable[[SandboxResult, float], None]:
    """The kernel refused the call for lack of privilege (not some other reason)."""
    def check(result: SandboxResult, _: float) -> None:
        assert printed(result, "errno") in allowed
    return check


def at_most(label: str, limit: int) -> Callable[[SandboxResult, float], None]:
    def check(result: SandboxResult, _: float) -> None:
        assert 0 <= printed(result, label) <= limit
    return check


def absent(*needles: str) -> Callable[[SandboxResult, float], None]:
    def check(result: SandboxResult, _: float) -> None:
        for needle in needles:
            assert needle not in result.stdout + result.stderr
    return check


def ended(error: str | None, within_s: float, *needles: str) -> Callable:
    """It ended this way, in time, having printed the needles (proof the attempt ran)."""
    def check(result: SandboxResult, elapsed: float) -> None:
        assert result.error == error and elapsed < within_s, (result.error, elapsed)
        for needle in needles:
            assert needle in result.stdout
    return check


def both(*checks: Callable) -> Callable:
    def check(result: SandboxResult, elapsed: float) -> None:
        for one in checks:
            one(result, elapsed)
    return check


def errno_in_label(label: str, expected: int) -> Callable:
    def check(result: SandboxResult, _: float) -> None:
        assert printed(result, label) == expected
    return check


def ended_any(errors: tuple[str, ...], within_s: float) -> Callable:
    def check(result: SandboxResult, elapsed: float) -> None:
        assert result.error in errors and elapsed < within_s, (result.error, elapsed)
    return check


FILESYSTEM_READS = [
    Attempt("etc-passwd", "print('LEAK', open('/etc/passwd').read())"),
    Attempt("etc-shadow", "print('LEAK', open('/etc/shadow').read())"),
    Attempt("list-root", "import os; print('ROOT', sorted(os.listdir('/')))",
            lambda r, _: _only_sandbox_dirs(r)),
    Attempt("project-source", "print('LEAK', open('$repo/agentrl/sandbox/launch.py').read())"),
    Attempt("project-listing", "import os; print('LEAK', os.listdir('$repo'))"),
    Attempt("root-home", "import os; print('LEAK', os.listdir('/root'))"),
    Attempt("home", "import os; print('LEAK', os.listdir('/home'))"),
    Attempt("host-tmp-file", "print('LEAK', open('$secret_file').read())"),
    Attempt("host-tmp-listing", "import os; print(os.listdir('/tmp'))",
            lambda r, h: absent("agentrl-redteam-")(r, h)),
    Attempt("proc1-root", "print('LEAK', open('/proc/1/root/etc/passwd').read())"),
    Attempt("proc-self-root-dotdot",
            "print('LEAK', open('/proc/self/root/../../../../etc/passwd').read())"),
    Attempt("symlink-to-host-file",
            "import os; os.symlink('$secret_file', 'l'); print('LEAK', open('l').read())"),
    Attempt("hardlink-to-host-file",
            "import os; os.link('$secret_file', 'h'); print('LEAK', open('h').read())"),
    Attempt("open-by-handle", LIBC + """
class Handle(ctypes.Structure):
    _fields_ = [('size', ctypes.c_uint), ('type', ctypes.c_int), ('f', ctypes.c_ubyte * 8)]
handle = Handle(8, 1, (ctypes.c_ubyte * 8)(2, 0, 0, 0, 0, 0, 0, 0))  # inode 2: a fs root
mount_fd = os.open('$stdlib', os.O_RDONLY)
fd = libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY)
""" + ERRNO + "if fd >= 0: print('LEAK', os.listdir(fd))", errno_in(EPERM)),
    Attempt("sysfs", "import os; print('LEAK', os.listdir('/sys/class/net'))"),
    Attempt("dev-listing", "import os; print('DEV', sorted(os.listdir('/dev')))",
            lambda r, _: _only_minimal_dev(r)),
    Attempt("dev-mem", "print('LEAK', open('/dev/mem', 'rb').read(16))"),
    Attempt("trainer-memory", "f = open('/proc/$host_pid/mem', 'rb'); print('LEAK', f.read(1))"),
    Attempt("trainer-environ", "print('LEAK', open('/proc/$host_pid/environ').read())"),
    Attempt("proc-listing",
            "import os; print('PIDS', sorted(int(p) for p in os.listdir('/proc') "
            "if p.isdigit()))", lambda r, _: _only_own_pids(r)),
    Attempt("proc-cmdlines", """
import os
for pid in os.listdir('/proc'):
    if pid.isdigit():
        print(pid, open(f'/proc/{pid}/cmdline', 'rb').read())
""", absent("pytest")),
    Attempt("proc-host-process", "print('LEAK', open('/proc/$sleeper_pid/cmdline').read())"),
    Attempt("chroot-breakout", """
import os
os.mkdir('jail'); os.chroot('jail'); os.chdir('../../..')
print('LEAK', open('etc/passwd').read())
"""),
    Attempt("mount-host-disk", LIBC + "os.mkdir('m')\n"
            "r = libc.mount(b'/dev/vda', b'm', b'ext4', 0, None)\n" + ERRNO +
            "if r == 0: print('LEAK', os.listdir('m'))", errno_in(EPERM, EACCES, 2)),
    Attempt("mount-tmpfs", LIBC + "os.mkdir('m')\n"
            "r = libc.mount(b'none', b'm', b'tmpfs', 0, None)\n" + ERRNO +
            "if r == 0: print('LEAK mounted')", errno_in(EPERM)),
    Attempt("unshare-user", LIBC + "r = libc.unshare(0x10000000)\n" + ERRNO +
            "if r == 0: print('LEAK new user namespace')", errno_in(EPERM, ENOSPC)),
    Attempt("unshare-mount", LIBC + "r = libc.unshare(0x00020000)\n" + ERRNO +
            "if r == 0: print('LEAK new mount namespace')", errno_in(EPERM)),
    # EINVAL: uid 0 is not even mapped into the sandbox's user namespace
    Attempt("setuid-root", LIBC + "r = libc.setuid(0)\n" + ERRNO +
            "if r == 0: print('LEAK root')", errno_in(EPERM, EINVAL)),
    Attempt("pivot-root", LIBC + "import platform\n"
            "nr = {'x86_64': 155, 'aarch64': 41}[platform.machine()]\n"
            "os.mkdir('new'); os.mkdir('new/old')\n"
            "r = libc.syscall(nr, b'new', b'new/old')\n" + ERRNO +
            "if r == 0: print('LEAK pivoted')", errno_in(EPERM, 22)),
    Attempt("mknod-disk", """
import os, stat
os.mknod('disk', stat.S_IFBLK | 0o600, os.makedev(8, 0))
print('LEAK', open('disk', 'rb').read(16))
"""),
]

FILESYSTEM_WRITES = [
    Attempt("write-host-tmp", "open('$target', 'w').write('x'); print('LEAK')"),
    Attempt("write-project", "open('$repo/agentrl-redteam-$marker', 'w').write('x')"),
    Attempt("append-stdlib", "import os; open(os.__file__, 'a').write('import evil')"),
    Attempt("new-stdlib-module", "open('$stdlib/evil_$marker.py', 'w').write('x')"),
    Attempt("write-etc-cron", "import os; os.makedirs('/etc/cron.d', exist_ok=True)\n"
            "open('/etc/cron.d/agentrl-$marker', 'w').write('* * * * * root id')"),
    Attempt("write-root-dir", "open('/agentrl-$marker', 'w').write('x')"),
    Attempt("write-root-home", "open('/root/agentrl-$marker', 'w').write('x')"),
    Attempt("chmod-stdlib", "import os; os.chmod(os.__file__, 0o777)"),
    Attempt("write-interpreter", "open('/proc/self/exe', 'r+b').write(b'x')"),
    Attempt("write-bwrap-via-proc1-exe", "open('/proc/1/exe', 'r+b').write(b'x')"),
    Attempt("scratch-bomb", """
import os
total = 0
try:
    for i in range(100000):
        with open(f'f{i}', 'wb') as f:
            f.write(b'x' * 65536)
        total += 65536
except OSError as exc:
    print('stopped', exc.errno)
print('total', total)
""", both(at_most("total", 4 * 2**20), errno_in_label("stopped", ENOSPC))),
    Attempt("file-size-bomb", """
import os
try:
    with open('big', 'wb', buffering=0) as f:
        for _ in range(1000):
            f.write(b'x' * 10000)
except OSError as exc:
    print('stopped', exc.errno)
print('size', os.path.getsize('big'))
""", both(at_most("size", 100_000), errno_in_label("stopped", 27))),
    Attempt("dev-shm", "open('/dev/shm/x', 'wb').write(b'x' * 1000); print('LEAK stored')"),
    Attempt("proc-sys-hostname", "open('/proc/sys/kernel/hostname', 'w').write('pwned')"),
    Attempt("core-pattern", "open('/proc/sys/kernel/core_pattern', 'w').write('|/tmp/x')"),
    Attempt("proc-fds", """
import os
for pid in ('1', 'self'):
    for fd in os.listdir(f'/proc/{pid}/fd'):
        path = f'/proc/{pid}/fd/{fd}'
        try:
            print(pid, fd, os.readlink(path), os.listdir(path))
        except OSError as exc:
            print(pid, fd, exc)
""", absent("pyproject.toml", "agentrl-redteam-", ".bashrc")),
    Attempt("inherited-fds", """
import os
for fd in range(3, 64):
    try:
        print(fd, os.read(fd, 200))
    except OSError:
        pass
"""),
]

PROCESSES = [
    Attempt("kill-parent", "import os; os.kill(os.getppid(), 9); print('sent')"),
    Attempt("kill-pid-1", "import os; os.kill(1, 9); print('sent')"),
    Attempt("kill-everything", "import os; os.kill(-1, 9)"),
    Attempt("kill-host-process", "import os; os.kill($sleeper_pid, 9)"),
    Attempt("signal-trainer", "import os, signal; os.kill($host_pid, signal.SIGUSR1)"),
    Attempt("signal-trainer-group", "import os, signal; os.killpg($host_pgid, signal.SIGUSR1)"),
    Attempt("pidfd-kill-host-process", LIBC + "fd = libc.pidfd_open($sleeper_pid, 0)\n" +
            ERRNO + "if fd >= 0: libc.pidfd_send_signal(fd, 9, None, 0); print('LEAK')",
            errno_in(3)),
    Attempt("ptrace-host-process", LIBC + "r = libc.ptrace(16, $sleeper_pid, 0, 0)\n" +
            ERRNO + "if r == 0: print('LEAK attached')", errno_in(3)),
    Attempt("read-trainer-memory", LIBC + """
class Vec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local, remote = Vec(ctypes.addressof(buf), 64), Vec(0x400000, 64)
r = libc.process_vm_readv($host_pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
""" + ERRNO + "if r > 0: print('LEAK', buf.raw)", errno_in(3)),
    Attempt("fork-bomb", """
import os, time
n = 0
try:
    while n < 500:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as exc:
    print('stopped', exc.errno)
print('forks', n)
""", both(at_most("forks", 8), errno_in_label("stopped", 11))),
    Attempt("thread-bomb", """
import threading, time
n = 0
try:
    while n < 500:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
except RuntimeError as exc:
    print('stopped', exc)
print('threads', n, flush=True)
import os; os._exit(0)
""", at_most("threads", 8)),
    Attempt("double-fork-daemon", DAEMON, ended(None, RED.wall_s + SLACK_S, "daemon running")),
    Attempt("daemon-then-timeout", DAEMON + "time.sleep(100)",
            ended("timeout", SHORT.wall_s + SLACK_S, "daemon running"), limits=SHORT),
    Attempt("grandchild-holds-stdout", """
import os, time
if os.fork() == 0:
    if os.fork() == 0:
        os.execv('$python', ['$python', '-c', 'import time; time.sleep(120)', '$marker'])
    os._exit(0)
os.wait()
time.sleep(0.3)
print('main exits')
""", ended(None, RED.wall_s + SLACK_S, "main exits")),
    Attempt("busy-children", """
import os
for _ in range(3):
    if os.fork() == 0:
        os.execv('$python', ['$python', '-c', 'while True: pass', '$marker'])
print('spinning', flush=True)
while True:
    pass
""", ended("timeout", SHORT.wall_s + SLACK_S, "spinning"), limits=SHORT),
    Attempt("os-system", "import os; print('status', os.system('echo pwned'))", absent("pwned")),
    Attempt("exec-shell", "import os; os.execv('/bin/sh', ['sh', '-c', 'echo pwned'])",
            absent("pwned")),
    Attempt("host-binary", "import subprocess; print('LEAK', subprocess.run(['/usr/bin/id']))"),
]

NETWORK = [
    Attempt("tcp-loopback", "import socket\n"
            "socket.create_connection(('127.0.0.1', $tcp_port), timeout=2); print('LEAK')"),
    Attempt("tcp-ipv6-loopback", "import socket\n"
            "socket.create_connection(('::1', $tcp6_port), timeout=2); print('LEAK')"),
    Attempt("udp-loopback", """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(5):
    s.sendto(b'escaped', ('127.0.0.1', $udp_port))
print('sent')
"""),
    Attempt("unix-socket-path", "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect('$unix_path'); print('LEAK')"),
    Attempt("abstract-unix-socket", "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect('\\0$abstract_name'); print('LEAK')"),
    Attempt("raw-socket", "import socket\n"
            "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print('LEAK')"),
    Attempt("packet-socket", "import socket\n"
            "socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('LEAK')"),
    Attempt("interfaces", "import socket; print('IFACES', socket.if_nameindex())",
            absent("eth0", "ifb0")),
]

ENVIRONMENT_AND_KERNEL = [
    Attempt("environment", "import os; print(dict(os.environ))"),
    Attempt("proc-environ", """
import os
for pid in ['self'] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        print(pid, open(f'/proc/{pid}/environ', 'rb').read())
    except OSError as exc:
        print(pid, exc)
"""),
    Attempt("sethostname", "import socket; socket.sethostname('pwned'); print('LEAK')"),
    Attempt("controlling-tty", "open('/dev/tty', 'w').write('pwned'); print('LEAK')"),
    Attempt("tiocsti", """
import fcntl, termios
for fd in (0, 1, 2):
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b'x'); print('LEAK injected')
    except OSError as exc:
        print(fd, exc)
"""),
    Attempt("reboot", LIBC + "r = libc.reboot(0)\n" + ERRNO + "if r == 0: print('LEAK')",
            errno_in(EPERM)),
    Attempt("load-kernel-module", LIBC + "import platform\n"
            "nr = {'x86_64': 313, 'aarch64': 273}[platform.machine()]\n"
            "fd = os.open('/proc/self/exe', os.O_RDONLY)\n"
            "r = libc.syscall(nr, fd, b'', 0)\n" + ERRNO + "if r == 0: print('LEAK')",
            errno_in(EPERM, ENOSYS)),  # ENOSYS: a kernel built without modules
    Attempt("io-ports", LIBC + "import platform\nassert platform.machine() == 'x86_64'\n"
            "r = libc.iopl(3)\n" + ERRNO + "if r == 0: print('LEAK')",
            errno_in(EPERM, ENOSYS)),
    Attempt("capabilities", "print(open('/proc/self/status').read())",
            lambda r, _: _no_privileges(r)),
    Attempt("raise-rlimits", """
import resource
for kind in (resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CPU):
    try:
        resource.setrlimit(kind, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print('LEAK raised', kind)
    except (ValueError, OSError) as exc:
        print(kind, exc)
"""),
]

RESOURCES = [
    Attempt("busy-loop", "while True:\n    pass",
            ended_any(("cpu_limit", "timeout"), SPIN.wall_s + SLACK_S), limits=SPIN),
    Attempt("busy-threads", """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
spin()
""", ended_any(("cpu_limit", "timeout"), SPIN.wall_s + SLACK_S), limits=SPIN),
    Attempt("sleep-forever", "import time; time.sleep(1000)",
            ended("timeout", SHORT.wall_s + SLACK_S), limits=SHORT),
    Attempt("stdout-flood", "while True:\n    print('x' * 10000)",
            lambda r, t: _flooded(r.stdout, r, t)),
    Attempt("stderr-flood", "import sys\nwhile True:\n    sys.stderr.write('x' * 10000)",
            lambda r, t: _flooded(r.stderr, r, t)),
    Attempt("memory-bomb", "x = bytearray(8 * 2**30)", ended("memory_limit", RED.wall_s + SLACK_S)),
    Attempt("memory-touch", """
chunks = []
try:
    while True:
        chunks.append(bytearray(16 * 2**20))
except MemoryError:
    print('mb', 16 * len(chunks))
""", at_most("mb", 256)),
]

HOOK_BYPASSES = [
    Attempt("hook-main-globals", """
import sys
m = sys.modules['__main__']
for name in ('DENY', 'BAD_MODULES', 'WRITE_EVENTS', 'READ_EVENTS'):
    getattr(m, name).clear()
m.SCRATCH = '/'; m.READ.append('')  # '' + '/' prefixes every path
import os
print('bypassed', os.listdir('/'))
print('LEAK', open('/etc/passwd').read())
""", lambda r, _: _bypassed(r), hook=True),
    Attempt("hook-gc-swap-code", """
import gc
for obj in gc.get_objects():
    if type(obj).__name__ == 'function' and obj.__name__ == 'hook':
        obj.__code__ = (lambda event, args: None).__code__
import os, socket
print('bypassed', os.listdir('/'))
socket.create_connection(('127.0.0.1', $tcp_port), timeout=2); print('LEAK')
""", lambda r, _: _bypassed(r), hook=True),
    Attempt("hook-imp-create-builtin", """
import _imp, os, sys, time
sys.modules['__main__'].READ.append('')  # to watch /proc; the bypass is _imp below
class Spec:
    name = '_posixsubprocess'
if Spec.name in sys.builtin_module_names:
    ps = _imp.create_builtin(Spec)  # no import event for the hook to see
else:  # an interpreter that builds it as an extension module: clear the hook's list
    sys.modules['__main__'].BAD_MODULES.clear()
    import _posixsubprocess as ps
argv = [b'$python', b'-c', b'import time; time.sleep(120)', b'$marker']
# args, executable_list, close_fds, pass_fds, cwd, env, 6 pipe fds, errpipe r/w,
# restore_signals, call_setsid, pgid_to_set, gid, extra_groups, uid, child_umask,
# preexec_fn, allow_vfork (3.11; older versions take fewer)
head = [argv, [b'$python'], True, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(),
        False, True, -1, None, None, None]
for tail in ([-1, None, False], [-1, None], [None]):
    try:
        pid = ps.fork_exec(*head, *tail)
        break
    except TypeError:
        continue
while b'$marker' not in open(f'/proc/{pid}/cmdline', 'rb').read():
    time.sleep(0.01)
print('bypassed: daemon', pid)
""", lambda r, _: _bypassed(r), hook=True),
    Attempt("hook-bypass-then-ctypes", """
import gc
for obj in gc.get_objects():
    if type(obj).__name__ == 'function' and obj.__name__ == 'hook':
        obj.__code__ = (lambda event, args: None).__code__
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
print('bypassed', libc.getpid())
s = socket.socket(socket.AF_UNIX); s.connect('\\0$abstract_name'); print('LEAK')
""", lambda r, _: _bypassed(r), hook=True),
    Attempt("hook-bypass-then-daemon", "import sys\nsys.modules['__main__'].DENY.clear()\n"
            "sys.modules['__main__'].READ.append('')\n" + DAEMON + "print('bypassed')",
            lambda r, _: _bypassed(r), hook=True),
    Attempt("hook-bypass-then-write-outside", """
import sys
m = sys.modules['__main__']
m.SCRATCH = ''; m.WRITE_EVENTS.clear()  # '' + '/' prefixes every path
print('bypassed')
open('/agentrl-$marker', 'w').write('x')
open('$target', 'w').write('x')
""", lambda r, _: _bypassed(r), hook=True),
]


def _only_sandbox_dirs(result: SandboxResult) -> None:
    from agentrl.sandbox.bwrap import host_uid
    from agentrl.sandbox.interpreter import sandbox_interpreter

    interp = sandbox_interpreter(host_uid())
    bound = {p.split("/")[1] for p in [interp.executable, *interp.stdlib_roots,
                                       *interp.libraries]}
    listing = set(eval(result.stdout.split("ROOT ", 1)[1]))  # our own repr of a list
    assert listing <= bound | {"dev", "proc", "tmp"}, listing


def _only_minimal_dev(result: SandboxResult) -> None:
    listing = set(eval(result.stdout.split("DEV ", 1)[1]))
    assert listing <= {"null", "zero", "full", "random", "urandom", "tty", "console", "pts",
                       "ptmx", "shm", "fd", "stdin", "stdout", "stderr", "core", "mqueue"}


def _only_own_pids(result: SandboxResult) -> None:
    pids = eval(result.stdout.split("PIDS ", 1)[1])
    assert pids and max(pids) < 100 and len(pids) <= RED.max_processes + 1, pids


def _no_privileges(result: SandboxResult) -> None:
    status = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    for kind in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[kind], 16) == 0, (kind, status[kind])
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Uid"].split()[0] != "0"


def _flooded(stream: str, result: SandboxResult, elapsed: float) -> None:
    # stopped at the output limit, long before its wall clock
    assert result.error == "output_limit" and result.truncated and elapsed < RED.wall_s
    assert len(stream) <= RED.max_output_bytes


def _bypassed(result: SandboxResult) -> None:
    # the audit hook really was defeated, so what held afterwards was the OS
    assert "bypassed" in result.stdout, (result.stdout, result.stderr)


ATTEMPTS = (FILESYSTEM_READS + FILESYSTEM_WRITES + PROCESSES + NETWORK
            + ENVIRONMENT_AND_KERNEL + RESOURCES + HOOK_BYPASSES)


def test_there_are_enough_distinct_attempts():
    names = [a.name for a in ATTEMPTS]
    assert len(names) == len(set(names)) and len(names) >= 60


@pytest.mark.slow  # every attempt starts a sandbox
@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.name for a in ATTEMPTS])
def test_escape_attempt_is_held(attempt: Attempt, host):
    marker = "agentrl-mark-" + uuid.uuid4().hex[:12]
    code = Template(attempt.code).substitute(host.values(marker))
    start = time.monotonic()
    result = run_python(code, attempt.limits, "bwrap", audit_hook=attempt.hook)
    elapsed = time.monotonic() - start
    assert "LEAK" not in result.stdout, (result.stdout, result.stderr)
    # held by the sandbox, not by a mistake in the attempt itself
    assert not re.search(r"^(SyntaxError|NameError|TypeError|AttributeError|ImportError"
                         r"|KeyError|IndentationError)", result.stderr, re.M), result.stderr
    if attempt.check is not None:
        attempt.check(result, elapsed)
    host.assert_intact(result.stdout + result.stderr, marker)

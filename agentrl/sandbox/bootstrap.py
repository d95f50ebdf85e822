"""The first Python the sandboxed interpreter runs: limits, audit hook, then the code.

It runs as ``python -I -S -B -X utf8 -c BOOTSTRAP CONFIG_JSON`` with the code on stdin.
The kernel rlimits are set here, before any model code, and cannot be raised again by it
(raising a hard limit needs CAP_SYS_RESOURCE in the initial user namespace). The audit hook
is an extra layer only: under ``bwrap`` the namespaces and the read-only root are the
boundary; under ``process`` the hook is most of what there is.
"""

from __future__ import annotations

import json

# Everything the hook needs is imported before it is installed, because imports after it
# are restricted.
BOOTSTRAP = r"""
import json, os, resource, sys, traceback
cfg = json.loads(sys.argv[1])
code = sys.stdin.read()
def limit(kind, value):
    resource.setrlimit(kind, (value, value))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
limit(resource.RLIMIT_FSIZE, cfg["file_bytes"])
limit(resource.RLIMIT_CORE, 0)
limit(resource.RLIMIT_NOFILE, 64)
if cfg["max_processes"] is not None:
    limit(resource.RLIMIT_NPROC, cfg["max_processes"])
if cfg["drop_to_nobody"]:
    limit(resource.RLIMIT_NPROC, 0)
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
limit(resource.RLIMIT_AS, cfg["memory_bytes"])
SCRATCH = cfg["scratch"]
READ = [SCRATCH] + cfg["read_roots"]
DEVICES = {"/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DENY = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "os.symlink", "os.link",
        "os.chown", "os.setxattr", "os.removexattr", "socket.__new__", "socket.bind",
        "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
        "os.chroot", "resource.setrlimit", "resource.prlimit", "sys.addaudithook"}
WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod",
                "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile",
                "shutil.copymode", "shutil.copystat", "shutil.move", "os.chflags"}
READ_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.walk", "os.fwalk"}
BAD_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi",
               "_xxsubinterpreters", "_socket"}
realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
def inside(path, roots):
    full = realpath(fsdecode(path))
    return any(full == r or full.startswith(r + sep) for r in roots) or full in DEVICES
def deny(what):
    raise PermissionError("sandbox: " + what + " is not allowed")
def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
        if not inside(path, [SCRATCH] if writing else READ):
            deny(("writing " if writing else "reading ") + repr(fsdecode(path)))
    elif event in DENY or event.startswith("ctypes."):
        deny(event)
    elif event in WRITE_EVENTS:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg, [SCRATCH]):
                deny(event + " outside the scratch directory")
    elif event in READ_EVENTS:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg, READ):
                deny(event + " of " + repr(fsdecode(arg)))
    elif event == "import" and args[0].split(".")[0] in BAD_MODULES:
        raise ImportError("sandbox: importing " + args[0] + " is not allowed")
if cfg["audit_hook"]:
    sys.addaudithook(hook)
del cfg, limit
try:
    exec(compile(code, "<sandbox>", "exec"), {"__name__": "__main__"})
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"""

PYTHON_FLAGS = ("-I", "-S", "-B", "-X", "utf8")
"""Isolated mode (no PYTHON* variables, no user site), no site-packages, no .pyc writes,
UTF-8 I/O whatever the locale."""


def bootstrap_argv(interpreter: str, *, scratch: str, read_roots: list[str], cpu_s: int,
                   memory_bytes: int, file_bytes: int, max_processes: int | None,
                   drop_to_nobody: bool, audit_hook: bool) -> list[str]:
    """The interpreter's command line that sets the limits and runs the code from stdin."""
    config = {"scratch": scratch, "read_roots": read_roots, "cpu_s": cpu_s,
              "memory_bytes": memory_bytes, "file_bytes": file_bytes,
              "max_processes": max_processes, "drop_to_nobody": drop_to_nobody,
              "audit_hook": audit_hook}
    return [interpreter, *PYTHON_FLAGS, "-c", BOOTSTRAP, json.dumps(config)]

"""Run untrusted Python (the model's code) in a limited subprocess.

What holds, layer by layer (``SandboxResult.isolation`` reports the optional ones):

- **Process**: a fresh interpreter (``python -I -S``: no site-packages, no user site, no
  ``PYTHON*`` variables) with an empty environment, in a new session, in a throw-away
  scratch directory that is deleted afterwards. Only the standard library is importable.
- **Limits** (kernel rlimits, always): CPU seconds (RLIMIT_CPU), address space
  (RLIMIT_AS: memory bombs get MemoryError), file size (RLIMIT_FSIZE: stdout and stderr
  go to files, so huge output ends the run with SIGXFSZ), open files, no core dumps.
  Wall-clock: the whole process group is SIGKILLed after ``wall_s``.
- **Network**: a new, empty network namespace (``unshare --net``) when the host allows
  it (``isolation["network"] == "namespace"``), and in every case an audit hook that
  refuses socket creation, connection and name resolution.
- **Files and processes**: a Python audit hook installed before the code runs refuses:
  opening for writing (and creating, removing, renaming, linking) anything outside the
  scratch directory; opening or listing anything outside the scratch directory and the
  interpreter's standard library (so the project, ``/etc/passwd`` and home directories
  are unreadable); ``fork``/``exec``/``spawn``/``subprocess``/``os.system``/signals;
  importing ``ctypes`` and ``_posixsubprocess``; any ``ctypes`` call.
- **User**: when the host runs as root and an interpreter of the same version is
  readable by others (the running one, else the system's ``/usr/bin/python3.X``), the
  code runs as ``nobody`` (``isolation["user"] == "nobody"``), so file permissions and
  RLIMIT_NPROC (no fork bombs) hold in the kernel too. Otherwise it runs as the calling
  user and the file and process rules rest on the audit hook.

What does not hold: an audit hook is not a security boundary against a determined
attacker with a memory-corruption bug in CPython; ``os.stat`` of outside paths is not
audited (existence leaks, contents do not); disk use inside the scratch directory is
capped per file (RLIMIT_FSIZE), not in total. For hostile workloads run the trainer in a
container or VM as well.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path

import msgspec

# Runs in the child as ``python -I -S -c BOOTSTRAP CONFIG_JSON`` with the code on stdin:
# set limits, maybe drop to nobody, install the audit hook, then run the code. Everything
# the hook needs is imported first, because imports after it are restricted.
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


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of one run."""

    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU)."""
    wall_s: float = 10.0
    """Wall-clock seconds before the process group is killed."""
    memory_mb: int = 512
    """Address space in MiB (RLIMIT_AS)."""
    max_output_bytes: int = 8_000
    """Bytes of stdout and of stderr returned to the caller; the rest is cut."""
    max_file_bytes: int = 1_000_000
    """Largest file the code may write, its stdout included (RLIMIT_FSIZE)."""


class SandboxResult(msgspec.Struct):
    """What one run produced and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The process's exit status; negative: killed by that signal."""
    error: str | None = None
    """None, "timeout", "cpu_limit", "output_limit", "memory_limit" or "exit_status"."""
    truncated: bool = False
    """stdout or stderr was longer than max_output_bytes and was cut."""
    isolation: dict[str, str] = {}
    """Which optional layers held: {"network": "namespace"|"audit_hook",
    "user": "nobody"|"same"}."""


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run code in the sandbox and return its output; never raises for the code's faults."""
    limits = limits or SandboxLimits()
    scratch = Path(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
    io_dir = Path(tempfile.mkdtemp(prefix="agentrl-sandbox-io-"))
    try:
        return _run(code, limits, scratch, io_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def describe(result: SandboxResult) -> str:
    """The result as text for the model: output, errors and why the run stopped."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr.rstrip()}")
    if result.truncated:
        parts.append("[output truncated]")
    messages = {
        "timeout": "[killed: wall-clock limit reached]",
        "cpu_limit": "[killed: CPU time limit reached]",
        "output_limit": "[killed: output or file size limit reached]",
        "memory_limit": "[failed: memory limit reached]",
        "exit_status": f"[exit status {result.exit_code}]",
    }
    if result.error in messages:
        parts.append(messages[result.error])
    return "\n".join(parts) if parts else "[no output]"


def _run(code: str, limits: SandboxLimits, scratch: Path, io_dir: Path) -> SandboxResult:
    drop = _can_drop_to_nobody()
    if drop:
        os.chown(scratch, 65534, 65534)
    config = {
        "scratch": str(scratch.resolve()),
        "read_roots": _stdlib_roots(),
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_mb * 2**20,
        "file_bytes": limits.max_file_bytes,
        "drop_to_nobody": drop,
    }
    prefix = _net_prefix()
    argv = [*prefix, _interpreter(), "-I", "-S", "-c", BOOTSTRAP, json.dumps(config)]
    out_path, err_path = io_dir / "stdout", io_dir / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                cwd=scratch, env={}, start_new_session=True)
        timed_out = _feed_and_wait(proc, code, limits.wall_s)
    stdout, cut_out = _read_capped(out_path, limits.max_output_bytes)
    stderr, cut_err = _read_capped(err_path, limits.max_output_bytes)
    isolation = {"network": "namespace" if prefix else "audit_hook",
                 "user": "nobody" if drop else "same"}
    return SandboxResult(stdout, stderr, proc.returncode, _error(proc.returncode, timed_out,
                         stderr), cut_out or cut_err, isolation)


def _feed_and_wait(proc: subprocess.Popen, code: str, wall_s: float) -> bool:
    """Send the code on stdin, wait; on timeout kill the whole process group."""
    timed_out = False
    try:
        assert proc.stdin is not None
        proc.stdin.write(code.encode("utf-8", "replace"))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died early; its exit status says why
    try:
        proc.wait(timeout=wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)  # also reaps anything the code left behind in its group
    proc.wait()
    return timed_out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _error(returncode: int | None, timed_out: bool, stderr: str) -> str | None:
    if timed_out:
        return "timeout"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"  # the kernel sends SIGXCPU at the soft limit, SIGKILL at the hard
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output_limit"  # Python ignores SIGXFSZ, so the write fails with EFBIG
    if "MemoryError" in stderr:
        return "memory_limit"
    if returncode:
        return "exit_status"
    return None


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) > limit


@cache
def _interpreter_and_stdlib() -> tuple[str, list[str]]:
    """The interpreter that runs the code, and its standard-library folders.

    The code needs only the standard library, so when the running interpreter sits where
    'nobody' cannot read it (e.g. under /root), a system interpreter of the same version
    that 'nobody' can read is preferred: then the drop to 'nobody' works and the kernel's
    file permissions and RLIMIT_NPROC hold beside the audit hook.
    """
    own = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    own_roots = _stdlib_of(own)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (own, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        path = os.path.realpath(candidate)
        if not os.path.exists(path) or not _others_can_read(path):
            continue
        roots = own_roots if path == own else _stdlib_of(path)
        if roots and all(_others_can_read(r) for r in roots):
            return path, roots
    return own, own_roots


def _stdlib_of(interpreter: str) -> list[str]:
    """The stdlib folders of an interpreter (asked in a subprocess; [] if it fails)."""
    if interpreter == os.path.realpath(getattr(sys, "_base_executable", sys.executable)):
        paths = sysconfig.get_paths()
        return sorted({os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")})
    query = ("import json, os, sysconfig; p = sysconfig.get_paths(); print(json.dumps("
             "sorted({os.path.realpath(p[k]) for k in ('stdlib', 'platstdlib')})))")
    try:
        out = subprocess.run([interpreter, "-I", "-S", "-c", query], capture_output=True,
                             timeout=10, env={}, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return []


def _interpreter() -> str:
    return _interpreter_and_stdlib()[0]


def _stdlib_roots() -> list[str]:
    return _interpreter_and_stdlib()[1]


@cache
def _net_prefix() -> tuple[str, ...]:
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


@cache
def _can_drop_to_nobody() -> bool:
    """Root, and 'nobody' can reach the interpreter and its standard library."""
    if os.geteuid() != 0 or _net_prefix()[-1:] == ("--map-root-user",):
        return False
    return all(_others_can_read(p) for p in [_interpreter(), *_stdlib_roots()])


def _others_can_read(path: str) -> bool:
    current = Path(path)
    for parent in [current, *current.parents]:
        mode = os.stat(parent).st_mode
        needed = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & needed:
            return False
    return True

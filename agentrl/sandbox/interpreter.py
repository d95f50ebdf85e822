"""The interpreter that runs model code, its standard library and the shared libraries
they load: the only host files a ``bwrap`` sandbox sees."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from functools import cache
from pathlib import Path

import msgspec

NOBODY = 65534
"""The host uid (and gid) of sandboxed code when the trainer runs as root."""

# A search path for the dynamic loader when ``ldd`` is missing: bind these whole folders.
FALLBACK_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")


class Interpreter(msgspec.Struct, frozen=True):
    """A Python interpreter and every host path it needs, read-only."""

    executable: str
    stdlib_roots: tuple[str, ...]
    """Standard-library folders (real paths)."""
    libraries: tuple[str, ...]
    """Shared libraries of the interpreter and its extension modules, as the dynamic loader
    names them (``/lib/x86_64-linux-gnu/libc.so.6``), or whole library folders."""
    hidden: tuple[str, ...]
    """Folders inside the stdlib roots to cover with an empty folder (site-packages)."""


def own_interpreter() -> str:
    """The running interpreter, outside any virtual environment (a real path)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@cache
def sandbox_interpreter(for_uid: int) -> Interpreter | None:
    """The interpreter the sandbox runs, reachable by ``for_uid``; None when none is.

    The code needs only the standard library, so when the running interpreter sits where
    ``for_uid`` cannot reach it (e.g. under /root, with the sandbox running as nobody), a
    system interpreter of the same version is used instead.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [own_interpreter(), f"/usr/bin/python{version}",
                  f"/usr/local/bin/python{version}"]
    for candidate in dict.fromkeys(os.path.realpath(c) for c in candidates):
        if not os.path.exists(candidate) or not reachable(candidate, for_uid):
            continue
        roots = stdlib_of(candidate)
        if roots and all(reachable(r, for_uid) for r in roots):
            libraries = shared_libraries(candidate, roots)
            if all(reachable(os.path.realpath(p), for_uid) for p in libraries):
                return Interpreter(candidate, tuple(roots), tuple(libraries), _hidden(roots))
    return None


def stdlib_of(interpreter: str) -> list[str]:
    """The stdlib folders of an interpreter, asked in a subprocess ([] if that fails).

    Asking the base interpreter itself (``-I -S``) gives its own folders, never a virtual
    environment's.
    """
    query = ("import json, os, sysconfig; p = sysconfig.get_paths(); print(json.dumps("
             "sorted({os.path.realpath(p[k]) for k in ('stdlib', 'platstdlib')})))")
    try:
        out = subprocess.run([interpreter, "-I", "-S", "-c", query], capture_output=True,
                             timeout=30, env={}, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return []


def shared_libraries(interpreter: str, stdlib_roots: list[str]) -> list[str]:
    """What the dynamic loader maps for the interpreter and its extension modules.

    Asks ``ldd`` once for all of them; without ``ldd`` it falls back to the standard
    library folders (more than needed, still read-only).
    """
    ldd = shutil.which("ldd")
    objects = [interpreter] + sorted(str(p) for root in stdlib_roots
                                     for p in Path(root, "lib-dynload").glob("*.so"))
    if ldd is None:
        return [d for d in FALLBACK_LIBRARY_DIRS if os.path.isdir(d)]
    out = subprocess.run([ldd, *objects], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.defpath}, check=False)
    found = set()
    for line in out.stdout.splitlines():
        match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if match:
            found.add(match.group(1))
    return sorted(p for p in found if os.path.exists(p))


def _hidden(stdlib_roots: list[str]) -> tuple[str, ...]:
    return tuple(str(Path(root, name)) for root in stdlib_roots
                 for name in ("site-packages", "dist-packages") if Path(root, name).is_dir())


def reachable(path: str, uid: int) -> bool:
    """Whether ``uid`` can reach (and read or execute) ``path`` through its parents."""
    if uid == os.geteuid() or uid == 0:
        return os.access(path, os.R_OK)
    current = Path(path)
    for parent in [current, *current.parents]:
        try:
            info = os.stat(parent)
        except OSError:
            return False
        if info.st_uid == uid:
            continue
        needed = stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else stat.S_IROTH
        if not info.st_mode & needed:
            return False
    return True

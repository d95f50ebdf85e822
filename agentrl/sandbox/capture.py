"""Launch one sandbox process, feed it the code, keep a bounded share of its output, and
kill everything it started once it ends, overruns its wall clock or floods its output."""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import time
from typing import Any

import msgspec

from agentrl.sandbox.types import SandboxLimits

TICK_S = 0.1
"""How often a quiet run is checked for having exited while something still holds its
output pipes (possible under ``process`` isolation only)."""


class Capture(msgspec.Struct):
    """What came back from one process: its output (cut) and how it ended."""

    stdout: bytes
    stderr: bytes
    truncated: bool
    returncode: int
    stopped: str | None
    """None, or why it was killed: "timeout" or "output_limit"."""


def launch(argv: list[str], code: str, limits: SandboxLimits, **popen: Any) -> Capture:
    """Run ``argv`` with ``code`` on stdin under the wall clock and output limits.

    The process starts a new session; whatever is left of that process group when the run
    ends (normally, at the deadline, or at the output limit) is SIGKILLed before the
    process is reaped, so the group id cannot have been reused.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={}, start_new_session=True, **popen)
    try:
        outputs, stopped = _pump(proc, code.encode("utf-8", "replace"), limits)
    finally:
        _kill_group(proc.pid)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
    limit = limits.max_output_bytes
    out, err = outputs[proc.stdout], outputs[proc.stderr]
    return Capture(bytes(out[:limit]), bytes(err[:limit]), len(out) > limit or len(err) > limit,
                   proc.returncode, stopped)


def _pump(proc: subprocess.Popen, code: bytes, limits: SandboxLimits
          ) -> tuple[dict[Any, bytearray], str | None]:
    """Write the code, read both outputs until they close, the deadline or a limit."""
    deadline = time.monotonic() + limits.wall_s
    selector = selectors.DefaultSelector()
    outputs: dict[Any, bytearray] = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    totals = dict.fromkeys(outputs, 0)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
    selector.register(proc.stdin, selectors.EVENT_WRITE)
    for stream in outputs:
        selector.register(stream, selectors.EVENT_READ)
    pending = memoryview(code)
    try:
        while any(key.fileobj in outputs for key in selector.get_map().values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return outputs, "timeout"
            events = selector.select(min(remaining, TICK_S))
            for key, _ in events:
                if key.fileobj is proc.stdin:
                    pending = _write_some(proc.stdin, pending, selector)
                    continue
                chunk = _read_some(key.fileobj)
                if chunk is None:
                    continue
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                totals[key.fileobj] += len(chunk)
                keep = limits.max_output_bytes + 1 - len(outputs[key.fileobj])
                outputs[key.fileobj] += chunk[:max(keep, 0)]
                if totals[key.fileobj] > limits.max_file_bytes:
                    return outputs, "output_limit"
            if not events and _exited(proc.pid):
                break  # something it left behind holds the pipes; the group kill ends it
        return outputs, _wait_exit(proc.pid, deadline)
    finally:
        selector.close()


def _write_some(stdin: Any, pending: memoryview, selector: selectors.BaseSelector
                ) -> memoryview:
    try:
        written = os.write(stdin.fileno(), pending[:65536])
    except BlockingIOError:
        return pending
    except (BrokenPipeError, OSError):
        written = len(pending)  # the child is gone; its exit status says why
    pending = pending[written:]
    if not pending:
        selector.unregister(stdin)
        stdin.close()
    return pending


def _read_some(stream: Any) -> bytes | None:
    """Up to 64 KiB; b"" at end of file, None when nothing is there yet."""
    try:
        return os.read(stream.fileno(), 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _exited(pid: int) -> bool:
    """Whether the process has exited, without reaping it (its pid stays ours)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _wait_exit(pid: int, deadline: float) -> str | None:
    """After its output closed, give the process until the deadline to exit."""
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(0.002)
    return None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise

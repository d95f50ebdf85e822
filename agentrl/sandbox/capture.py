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

from agentrl.sandbox.scope import current_scope
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
    """None, or why it was killed: "timeout", "output_limit", or "abandoned" (the call it
    served passed its deadline: :mod:`agentrl.sandbox.scope`)."""


def launch(argv: list[str], code: str, limits: SandboxLimits, **popen: Any) -> Capture:
    """Run ``argv`` with ``code`` on stdin under the wall clock and output limits.

    The process starts a new session; whatever is left of that process group when the run
    ends (normally, at the deadline, or at the output limit) is SIGKILLed before the
    process is reaped, so the group id cannot have been reused. Inside an abandoned
    :class:`~agentrl.sandbox.scope.ProcessScope` nothing starts.
    """
    scope = current_scope()
    if scope is not None and scope.closed:  # the call it serves was abandoned
        return Capture(b"", b"", False, -signal.SIGKILL, "abandoned")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={}, start_new_session=True, **popen)
    if scope is not None and not scope.started(proc.pid):
        _kill_group(proc.pid)  # abandoned while it started
    outputs = _Outputs(proc, limits)
    stopped = None
    try:
        stopped = _pump(proc, code.encode("utf-8", "replace"), outputs, limits.wall_s)
    finally:
        _kill_group(proc.pid)
        if scope is not None:
            scope.ended(proc.pid)
            stopped = "abandoned" if scope.closed else stopped
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
    return outputs.capture(proc.returncode, stopped)


class _Outputs:
    """stdout and stderr as they arrive: the first bytes kept, every byte counted."""

    def __init__(self, proc: subprocess.Popen, limits: SandboxLimits) -> None:
        self.streams = {proc.stdout: bytearray(), proc.stderr: bytearray()}
        self.totals = dict.fromkeys(self.streams, 0)
        self.proc, self.limits = proc, limits

    def take(self, stream: Any, chunk: bytes) -> bool:
        """Keep what fits; True when the stream is past ``max_file_bytes``."""
        kept = self.streams[stream]
        kept += chunk[:max(self.limits.max_output_bytes + 1 - len(kept), 0)]
        self.totals[stream] += len(chunk)
        return self.totals[stream] > self.limits.max_file_bytes

    def drain(self, selector: selectors.BaseSelector) -> str | None:
        """Read whatever is already in the pipes (the process has exited)."""
        for key in list(selector.get_map().values()):
            while key.fileobj in self.streams:
                chunk = _read_some(key.fileobj)
                if not chunk:
                    break
                if self.take(key.fileobj, chunk):
                    return "output_limit"
        return None

    def capture(self, returncode: int, stopped: str | None) -> Capture:
        limit = self.limits.max_output_bytes
        out, err = self.streams[self.proc.stdout], self.streams[self.proc.stderr]
        return Capture(bytes(out[:limit]), bytes(err[:limit]),
                       len(out) > limit or len(err) > limit, returncode, stopped)


def _pump(proc: subprocess.Popen, code: bytes, outputs: _Outputs, wall_s: float
          ) -> str | None:
    """Write the code, read both outputs until they close; why it was stopped, if it was."""
    deadline = time.monotonic() + wall_s
    selector = selectors.DefaultSelector()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
    selector.register(proc.stdin, selectors.EVENT_WRITE)
    for stream in outputs.streams:
        selector.register(stream, selectors.EVENT_READ)
    pending = memoryview(code)
    try:
        while any(key.fileobj in outputs.streams for key in selector.get_map().values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            events = selector.select(min(remaining, TICK_S))
            for key, _ in events:
                if key.fileobj is proc.stdin:
                    pending = _write_some(proc.stdin, pending, selector)
                    continue
                chunk = _read_some(key.fileobj)
                if chunk == b"":
                    selector.unregister(key.fileobj)
                elif chunk and outputs.take(key.fileobj, chunk):
                    return "output_limit"
            if not events and _exited(proc.pid):
                # something it left behind holds the pipes (the group kill ends it); what
                # the process wrote just before it exited is still in them
                return outputs.drain(selector)
        return _wait_exit(proc.pid, deadline)
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

"""The host side of the red team: things a sandbox escape would touch, watched from outside.

``Host`` sets out bait (a secret in the trainer's environment, in a host /tmp file and in
an inherited file descriptor; TCP, UDP, Unix-path and abstract-socket listeners on
loopback; a sleeping host process; a SIGUSR1 handler) and snapshots what must not change
(standard library, interpreter, bwrap binary, hostname, core_pattern). ``assert_intact``
checks every one of them after each attempt, whatever the attempt was aiming at.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from agentrl.sandbox import bwrap_problem
from agentrl.sandbox.bwrap import find_bwrap, host_uid
from agentrl.sandbox.interpreter import sandbox_interpreter

REPO = Path(__file__).resolve().parents[2]


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    needle, found = marker.encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # exited meanwhile
    return found


def wait_until(condition, timeout_s: float, step_s: float = 0.02) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return bool(condition())
        time.sleep(step_s)
    return True


def _snapshot(path: str) -> tuple:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns, info.st_mode, info.st_nlink


class Host:
    """Bait and witnesses on the host; ``close()`` takes them down."""

    def __init__(self) -> None:
        problem = bwrap_problem()
        assert problem is None, problem  # the red team runs against the real sandbox
        self.interpreter = sandbox_interpreter(host_uid())
        self.stdlib = self.interpreter.stdlib_roots[0]
        self.secret = "agentrl-secret-" + uuid.uuid4().hex
        self.secret_dir = Path(tempfile.mkdtemp(prefix="agentrl-redteam-", dir="/tmp"))
        self.secret_dir.chmod(0o755)
        self.secret_file = self.secret_dir / "secret.txt"
        self.secret_file.write_text(self.secret)
        self.secret_file.chmod(0o644)  # readable by anyone on the host: only the mount ns hides it
        self.target = self.secret_dir / "escaped.txt"
        self.old_env = os.environ.get("AGENTRL_REDTEAM_SECRET")
        os.environ["AGENTRL_REDTEAM_SECRET"] = self.secret
        self.inherited_fd = os.open(self.secret_file, os.O_RDONLY)
        os.set_inheritable(self.inherited_fd, True)
        self._listen()
        self.sleeper_mark = "agentrl-sleeper-" + uuid.uuid4().hex
        self.sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)",
                                         self.sleeper_mark])
        self.signals: list[int] = []
        self.old_handler = signal.signal(signal.SIGUSR1, lambda n, f: self.signals.append(n))
        self.watched = {p: _snapshot(p) for p in self._watched_files()}
        self.hostname = socket.gethostname()
        self.core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()

    def _listen(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = str(self.secret_dir / "host.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen()
        self.abstract_name = "agentrl-redteam-" + uuid.uuid4().hex
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        for sock in (self.tcp, self.tcp6, self.udp, self.unix, self.abstract):
            sock.setblocking(False)

    def _watched_files(self) -> list[str]:
        return [os.path.join(self.stdlib, "os.py"), self.interpreter.executable,
                str(find_bwrap()), str(self.secret_file)]

    def values(self, marker: str) -> dict[str, str]:
        """What attempts may name ($name in their code)."""
        return {"secret_file": str(self.secret_file), "secret_dir": str(self.secret_dir),
                "target": str(self.target), "repo": str(REPO),
                "tcp_port": str(self.tcp.getsockname()[1]),
                "tcp6_port": str(self.tcp6.getsockname()[1]),
                "udp_port": str(self.udp.getsockname()[1]), "unix_path": self.unix_path,
                "abstract_name": self.abstract_name, "host_pid": str(os.getpid()),
                "host_pgid": str(os.getpgid(0)), "sleeper_pid": str(self.sleeper.pid),
                "inherited_fd": str(self.inherited_fd), "marker": marker,
                "stdlib": self.stdlib, "python": self.interpreter.executable}

    def must_not_exist(self, marker: str) -> list[Path]:
        """Files an escaping write would create (attempts put ``marker`` in their names)."""
        return [self.target, REPO / f"agentrl-redteam-{marker}",
                Path(self.stdlib, f"evil_{marker}.py"), Path(f"/etc/cron.d/agentrl-{marker}"),
                Path(f"/agentrl-{marker}"), Path(f"/root/agentrl-{marker}"),
                Path(f"/tmp/agentrl-{marker}")]

    def contacts(self) -> list[str]:
        """Anything that reached a listener since the last call."""
        arrived = []
        for name, sock in (("tcp", self.tcp), ("tcp6", self.tcp6), ("unix", self.unix),
                           ("abstract", self.abstract)):
            try:
                conn, _ = sock.accept()
                conn.close()
                arrived.append(name)
            except BlockingIOError:
                pass
        try:
            arrived.append(f"udp {self.udp.recv(100)!r}")
        except BlockingIOError:
            pass
        return arrived

    def assert_intact(self, output: str, marker: str) -> None:
        """Every host-side witness says nothing escaped."""
        assert self.secret not in output, "the secret reached the sandbox's output"
        assert self.sleeper_mark not in output, "a host process's command line was read"
        assert self.contacts() == [], "a host listener was reached"
        assert self.sleeper.poll() is None, "a host process was killed"
        assert self.sleeper_status()["TracerPid"] == "0", "a host process was traced"
        assert self.signals == [], "the trainer was signalled"
        for path in self.must_not_exist(marker):
            assert not path.exists(), f"{path} was created on the host"
        for path, before in self.watched.items():
            assert _snapshot(path) == before, f"{path} was changed"
        assert socket.gethostname() == self.hostname, "the host's name was changed"
        assert Path("/proc/sys/kernel/core_pattern").read_text() == self.core_pattern
        survivors = wait_until(lambda: not processes_with(marker), 5.0)
        assert survivors, f"processes outlived the run: {processes_with(marker)}"

    def sleeper_status(self) -> dict[str, str]:
        lines = Path(f"/proc/{self.sleeper.pid}/status").read_text().splitlines()
        return dict(line.split(":\t", 1) for line in lines if ":\t" in line)

    def close(self) -> None:
        signal.signal(signal.SIGUSR1, self.old_handler)
        self.sleeper.kill()
        self.sleeper.wait()
        for sock in (self.tcp, self.tcp6, self.udp, self.unix, self.abstract):
            sock.close()
        os.close(self.inherited_fd)
        if self.old_env is None:
            os.environ.pop("AGENTRL_REDTEAM_SECRET", None)
        else:
            os.environ["AGENTRL_REDTEAM_SECRET"] = self.old_env
        shutil.rmtree(self.secret_dir, ignore_errors=True)

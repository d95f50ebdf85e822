"""Headless Chromium for page tests: dump the DOM after the script ran, or drive the page
through the DevTools protocol over ``--remote-debugging-pipe`` (commands on fd 3, replies
on fd 4, each message ending in a NUL byte), so clicks and form changes run for real."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    """The Chromium binary; fails under CI, skips locally, when it is not installed."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def dump_dom(url: str, profile: Path) -> str:
    """The DOM after the page's script ran, as Chromium serializes it."""
    args = [chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000",
            "--dump-dom", url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Browser:
    """One page in a headless Chromium, driven by DevTools protocol commands."""

    def __init__(self, url: str, profile: Path, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()

        def pipes_on_3_and_4() -> None:  # in the child, before exec
            ours = os.dup(commands_r), os.dup(replies_w)
            for target, fd in zip((3, 4), ours, strict=True):
                os.dup2(fd, target)
                os.set_inheritable(target, True)

        self._process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "about:blank"],
            preexec_fn=pipes_on_3_and_4, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(commands_r)
        os.close(replies_w)
        self._buffer = b""
        self._next_id = 0
        target = self.command("Target.createTarget", {"url": url})["targetId"]
        self._session = self.command("Target.attachToTarget",
                                     {"targetId": target, "flatten": True})["sessionId"]
        self.wait_for("document.readyState === 'complete'")

    def command(self, method: str, params: dict | None = None, session: bool = False) -> Any:
        """Send one command and return its result."""
        self._send(method, params, session)
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                assert "error" not in reply, reply
                return reply["result"]

    def _send(self, method: str, params: dict | None, session: bool) -> None:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], deadline - time.monotonic())
            assert ready, "no reply from Chromium in time"
            chunk = os.read(self._replies, 1 << 16)
            assert chunk, "Chromium closed the DevTools pipe"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.command("Runtime.evaluate",
                              {"expression": expression, "returnByValue": True}, session=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, condition: str) -> None:
        """Poll until a JavaScript condition holds (events such as hashchange are async)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.evaluate(f"Boolean({condition})"):
            assert time.monotonic() < deadline, f"timed out waiting for {condition}"
            time.sleep(0.05)

    def close(self) -> None:
        """Close the browser and the pipes."""
        try:
            self._send("Browser.close", None, session=False)  # no reply comes: it closes
        except OSError:
            pass
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._commands)
        os.close(self._replies)

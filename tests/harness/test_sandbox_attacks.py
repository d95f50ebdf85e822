"""Agent programs attacking the trainer (issue 41), judged by what reaches the host: a
host Unix socket, the answer file as a link to a root-only file, a folder or a FIFO,
another user planting an answer, a flood of connections or processes. Each attack is
refused or contained in its own rollout, and the collection goes on."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.sandbox import bwrap_problem
from agentrl.sandbox.bwrap import host_uid
from agentrl.sandbox.interpreter import sandbox_interpreter
from agentrl.sandbox.program import MAX_CONNECTIONS
from tests.harness.conftest import AGENTS, ROOT, collect, harness_config

ATTACKER = str(AGENTS / "attacker.py")
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None,
                                 reason="bubblewrap cannot run here")
SANDBOXES = [False, pytest.param(True, marks=needs_bwrap)]


def attack(model_dir: Path, *args: str, sandbox: bool = True, **harness: Any) -> Any:
    """The one rollout of ``attacker.py ARGS`` (sandboxed or not), graded by its answer
    read as a number; run on a thread that must finish within a minute."""
    python = sandbox_interpreter(host_uid()).executable if sandbox else sys.executable
    config = harness_config(model_dir, {"command": [python, ATTACKER, *args],
                                        "sandbox": sandbox, "cwd": str(ROOT),
                                        "timeout_s": 20.0,
                                        "grader": str(AGENTS / "graders.py") + ":number",
                                        **harness})
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = collect(config, model_dir)[0]
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the collection hung on the program's answer file"
    if "error" in box:
        raise AssertionError(f"the collection raised: {box['error']!r}") from box["error"]
    [rollout] = box["result"].rollouts
    return rollout


def listening_socket(folder: str) -> socket.socket:
    """A world-writable Unix socket in ``folder`` (made enterable by everyone)."""
    os.chmod(folder, 0o755)
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.path.join(folder, "service.sock"))
    os.chmod(os.path.join(folder, "service.sock"), 0o777)
    server.listen(8)
    server.setblocking(False)
    return server


@needs_bwrap
def test_no_host_unix_socket_is_reachable_but_the_endpoint_is(tiny_dir) -> None:
    # one in /var/tmp, one beside the program in its (read-only) working folder
    folders = [tempfile.mkdtemp(dir="/var/tmp"), tempfile.mkdtemp(dir=ROOT, prefix=".sock-")]
    servers = [listening_socket(folder) for folder in folders]
    try:
        rollout = attack(tiny_dir, "sockets",
                         *(os.path.join(folder, "service.sock") for folder in folders))
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody connected
    finally:
        for server, folder in zip(servers, folders, strict=True):
            server.close()
            os.unlink(os.path.join(folder, "service.sock"))
            os.rmdir(folder)
    assert rollout.valid, rollout.stats.error
    assert rollout.reward == 1.0  # the endpoint still answered


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("mode", ["link", "dir", "fifo"])
def test_an_answer_file_that_is_not_a_plain_file_invalidates_only_its_rollout(
        tiny_dir, tmp_path, mode, sandbox) -> None:
    secret = tmp_path / "secret"
    secret.write_text("4242")
    os.chmod(secret, 0o600)  # the trainer's, unreadable by the program's uid
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "agentrl-harness-*")))
    rollout = attack(tiny_dir, mode, *([str(secret)] if mode == "link" else []),
                     sandbox=sandbox)
    assert not rollout.valid and rollout.reward == 0.0
    assert rollout.stats.error_kind == "harness_bad_answer", rollout.stats.error
    assert "4242" not in rollout.stats.error
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "agentrl-harness-*")))
    assert after <= before, "the program's host folder was left behind"


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="playing another local user needs root")
def test_another_local_user_cannot_plant_the_answer(tiny_dir) -> None:
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "agentrl-harness-*")))
    planted: list[int] = []

    def plant() -> None:  # another user on the machine, watching for the program's folder
        for _ in range(200):
            now = set(glob.glob(os.path.join(tempfile.gettempdir(), "agentrl-harness-*")))
            for folder in now - before:
                write = ("import sys; open(sys.argv[1] + '/answer.txt', 'w')"
                         ".write('1000')")
                python = sandbox_interpreter(4321).executable  # one the other user may run
                planted.append(subprocess.run([python, "-c", write, folder],
                                              user=4321, group=4321, extra_groups=[],
                                              capture_output=True).returncode)
                return
            time.sleep(0.05)

    planter = threading.Thread(target=plant)
    planter.start()
    rollout = attack(tiny_dir, "wait", "3")
    planter.join()
    assert planted, "the program's folder never appeared"
    assert planted != [0], "another user wrote into the program's folder"
    assert rollout.valid and rollout.reward == 1.0  # the program's own answer


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@needs_bwrap
def test_a_connection_flood_holds_at_most_the_cap_of_the_trainers_descriptors(tiny_dir
                                                                             ) -> None:
    baseline, peak, done = fd_count(), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], fd_count())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:  # descriptors enough for all 1,200: only the forwarder's cap stands in the way
        rollout = attack(tiny_dir, "hold", "1200", "3", max_open_files=2048)
    finally:
        done.set()
        watcher.join()
    assert rollout.valid, rollout.stats.error
    assert rollout.reward == 1200  # it did open them all, inside
    assert peak[0] - baseline <= MAX_CONNECTIONS + 32  # the trainer held at most the cap


@needs_bwrap
def test_the_program_holds_at_most_its_descriptor_limit(tiny_dir) -> None:
    rollout = attack(tiny_dir, "hold", "1200", "0", max_open_files=64)
    assert rollout.valid, rollout.stats.error
    assert rollout.reward < 64


@needs_bwrap
def test_a_fork_flood_stops_at_the_process_limit(tiny_dir) -> None:
    rollout = attack(tiny_dir, "fork", "100", max_processes=32)
    assert rollout.valid, rollout.stats.error
    assert rollout.reward < 32

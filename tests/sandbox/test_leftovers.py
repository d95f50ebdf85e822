"""Nothing outlives a sandboxed call: not its processes (after a normal end, a timeout, or
the trainer being SIGKILLed mid-call) and not its scratch folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxLimits, run_python
from tests.sandbox.host import REPO, processes_with, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:isolation = \"process\"")

# A sleeping grandchild (plain fork) and a double-forked daemon in a new session, both
# carrying the marker in their command lines; then the call itself sleeps.
SPAWN_AND_SLEEP = """
import os, sys, time
def start(detach):
    if os.fork() == 0:
        if detach:
            os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)',
                                      '{marker}'])
        os._exit(0)
start(False)
start(True)
print('spawned', flush=True)
time.sleep(300)
"""

# The trainer: calls the sandbox from a worker thread, as the tool runner does.
TRAINER = """
import sys, threading
sys.path.insert(0, {repo!r})
from agentrl.sandbox import SandboxLimits, run_python
limits = SandboxLimits(cpu_s=300, wall_s=300.0)
worker = threading.Thread(target=run_python, args=({code!r}, limits, {isolation!r}),
                          kwargs={{"audit_hook": False}})
worker.start()
worker.join()
"""


def test_nothing_survives_the_trainer_being_killed_mid_call():
    marker = "agentrl-orphan-" + uuid.uuid4().hex[:12]
    code = SPAWN_AND_SLEEP.format(marker=marker)
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(
        repo=str(REPO), code=code, isolation="bwrap")])
    def sandboxed() -> list[int]:  # the trainer's own command line holds the marker too
        return [pid for pid in processes_with(marker) if pid != trainer.pid]

    try:
        assert wait_until(lambda: len(sandboxed()) == 2, 60.0), \
            "the grandchild and the daemon did not start"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert wait_until(lambda: not sandboxed(), 5.0), sandboxed()


def test_a_timed_out_call_leaves_no_process():
    marker = "agentrl-timeout-" + uuid.uuid4().hex[:12]
    result = run_python(SPAWN_AND_SLEEP.format(marker=marker),
                        SandboxLimits(wall_s=3.0, cpu_s=10), "bwrap", audit_hook=False)
    assert result.error == "timeout" and "spawned" in result.stdout
    assert wait_until(lambda: not processes_with(marker), 5.0), processes_with(marker)


@pytest.mark.parametrize("isolation", ["bwrap", "process"])
def test_no_scratch_folder_is_left_behind(isolation, monkeypatch):
    # a private temporary folder, so other users of /tmp cannot disturb the count
    private = Path(tempfile.mkdtemp(prefix="agentrl-scratch-test-"))
    private.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    name = "agentrl-scratch-" + uuid.uuid4().hex[:12]
    limits = SandboxLimits(wall_s=3.0, cpu_s=5, max_output_bytes=100, max_file_bytes=10_000)
    try:
        runs = [run_python(f"open({name!r}, 'w').write('x')\nprint('ok')", limits, isolation),
                run_python(f"open({name!r}, 'w').write('x')\nraise SystemExit(3)", limits,
                           isolation),
                run_python(f"open({name!r}, 'w').write('x')\nimport time; time.sleep(60)",
                           limits, isolation),
                run_python(f"open({name!r}, 'w').write('x')\nwhile True: print('y' * 999)",
                           limits, isolation)]
        assert [r.error for r in runs] == [None, "exit_status", "timeout", "output_limit"]
        assert list(private.iterdir()) == []
        # bwrap never makes a host folder: the scratch is a tmpfs of the call's own mount
        # namespace, so the file it wrote is nowhere in the host's temporary folders
        assert not any(name in files for _, _, files in os.walk(private))
    finally:
        os.rmdir(private)


def test_python_env_never_abandons_a_call_before_its_wall_clock():
    from environments.python import PythonEnv

    env = PythonEnv(wall_s=40.0)
    assert env.tool_timeout_s >= env.limits.wall_s + 5

"""The Python sandbox under both isolations: normal code behaves, escape attempts fail
cleanly and leave the host untouched. (tests/sandbox/ holds the red team against bwrap.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxLimits, describe, run_python

LIMITS = SandboxLimits(cpu_s=1, wall_s=2.0, memory_mb=200, max_output_bytes=500,
                       max_file_bytes=20_000)
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore:isolation = \"process\"")


@pytest.fixture(params=["bwrap", "process"])
def isolation(request):
    return request.param


def test_normal_code_runs_in_a_scratch_dir(isolation):
    result = run_python("import json, math\nopen('x.txt', 'w').write('hi')\n"
                        "print(json.dumps([math.factorial(5), open('x.txt').read()]))",
                        LIMITS, isolation)
    assert (result.stdout, result.error, result.exit_code) == ('[120, "hi"]\n', None, 0)
    assert result.isolation["mechanism"] == isolation


@pytest.mark.parametrize("code, needle", [
    (f"print(open({str(REPO / 'agentrl' / 'env.py')!r}).read())", "reading"),
    ("print(open('/etc/passwd').read())", "reading '/etc/passwd'"),
    ("import os\nprint(os.listdir('/'))", "os.listdir"),
    ("import os\nos.symlink('/etc/passwd', 'p')", "os.symlink"),
    ("import os\nos.chdir('/')\nprint(open('etc/hostname').read())", "reading"),
])
def test_reading_outside_is_refused(code, needle, isolation):
    result = run_python(code, LIMITS, isolation)
    # the audit hook refuses, or (bwrap) the path is not there at all: a checkout under
    # /tmp is "scratch" to the hook, but the host's /tmp is never mounted
    absent = isolation == "bwrap" and "No such file or directory" in result.stderr
    assert result.error == "exit_status" and (needle in result.stderr or absent)
    assert "root:" not in result.stdout and "AgentEnv" not in result.stdout


def test_writing_outside_is_refused(tmp_path, isolation):
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import shutil\nopen('a', 'w').write('x')\nshutil.copy('a', {str(target)!r})"):
        result = run_python(code, LIMITS, isolation)
        # process: the audit hook refuses; bwrap: the host's /tmp is not there at all
        assert result.exit_code == 1
        assert "PermissionError" in result.stderr or "FileNotFoundError" in result.stderr
    assert not target.exists()


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",
    "import os\nos.system('echo pwned')",
    "import os\nos.execv('/bin/sh', ['sh'])",
    "import ctypes\nctypes.CDLL(None).fork()",
])
def test_process_creation_is_refused(code, isolation):
    result = run_python(code, LIMITS, isolation)
    assert result.exit_code == 1 and "pwned" not in result.stdout
    assert "not allowed" in result.stderr


def test_network_is_unreachable(isolation):
    result = run_python("import socket\ns = socket.create_connection(('127.0.0.1', 22), "
                        "timeout=1)", LIMITS, isolation)
    assert result.exit_code == 1 and "not allowed" in result.stderr
    expected = ("namespace",) if isolation == "bwrap" else ("namespace", "audit_hook")
    assert result.isolation["network"] in expected


def test_infinite_loop_hits_the_cpu_limit(isolation):
    start = time.monotonic()
    result = run_python("while True:\n    pass", LIMITS, isolation)
    assert result.error in ("cpu_limit", "timeout") and time.monotonic() - start < 5


def test_sleeping_forever_hits_the_wall_clock(isolation):
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.5), isolation)
    assert result.error == "timeout" and "wall-clock" in describe(result)


def test_memory_bomb_fails_cleanly(isolation):
    result = run_python("x = bytearray(2 * 1024**3)", LIMITS, isolation)
    assert result.error == "memory_limit" and "MemoryError" in result.stderr


def test_huge_output_is_capped(isolation):
    result = run_python("while True:\n    print('x' * 1000)", LIMITS, isolation)
    assert result.error == "output_limit" and result.truncated
    assert len(result.stdout) == LIMITS.max_output_bytes


def test_scratch_does_not_outlive_the_run(isolation):
    marker = f"agentrl-scratch-probe-{os.getpid()}-{isolation}"
    result = run_python(f"import os\nopen({marker!r}, 'w').write('x')\nprint(os.getcwd())",
                        LIMITS, isolation)
    scratch = result.stdout.strip()
    assert scratch and result.error is None
    # process: the host folder is deleted; bwrap: the folder was a tmpfs of the sandbox's
    # own mount namespace, so its file never existed on the host
    assert not Path(scratch, marker).exists()


def test_the_code_never_runs_as_root_on_the_host(isolation):
    from agentrl.sandbox.bwrap import SANDBOX_UID
    from agentrl.sandbox.process import process_interpreter

    result = run_python("import os; print(os.getuid())", LIMITS, isolation)
    if isolation == "bwrap":
        # its own user namespace; on the host it is nobody when the trainer is root
        assert result.stdout.strip() == str(SANDBOX_UID)
        host = 65534 if os.geteuid() == 0 else os.geteuid()
        assert result.isolation["user"].endswith(f"host uid {host}")
    elif os.geteuid() == 0 and process_interpreter()[1]:
        assert result.stdout.strip() == "65534" and result.isolation["user"] == "nobody"
    else:
        assert result.stdout.strip() == str(os.geteuid()) and result.isolation["user"] == "same"


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="cpu_s = 0"):
        SandboxLimits(cpu_s=0)
    with pytest.raises(ValueError, match="wall_s = inf"):
        SandboxLimits(wall_s=float("inf"))

"""Escape attempts against the Python sandbox fail cleanly and leave the host untouched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxLimits, describe, run_python

LIMITS = SandboxLimits(cpu_s=1, wall_s=2.0, memory_mb=200, max_output_bytes=500,
                       max_file_bytes=20_000)
REPO = Path(__file__).resolve().parents[2]


def run(code: str):
    return run_python(code, LIMITS)


def test_normal_code_runs_in_a_scratch_dir():
    result = run("import json, math\nopen('x.txt', 'w').write('hi')\n"
                 "print(json.dumps([math.factorial(5), open('x.txt').read()]))")
    assert (result.stdout, result.error, result.exit_code) == ('[120, "hi"]\n', None, 0)


@pytest.mark.parametrize("code, needle", [
    (f"print(open({str(REPO / 'agentrl' / 'env.py')!r}).read())", "reading"),
    ("print(open('/etc/passwd').read())", "reading '/etc/passwd'"),
    ("import os\nprint(os.listdir('/'))", "os.listdir"),
    ("import os\nos.symlink('/etc/passwd', 'p')", "os.symlink"),
    ("import os\nos.chdir('/')\nprint(open('etc/hostname').read())", "reading"),
])
def test_reading_outside_is_refused(code, needle):
    result = run(code)
    assert result.error == "exit_status" and needle in result.stderr
    assert "root:" not in result.stdout and "AgentEnv" not in result.stdout


def test_writing_outside_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import shutil\nopen('a', 'w').write('x')\nshutil.copy('a', {str(target)!r})"):
        result = run(code)
        assert result.exit_code == 1 and "PermissionError" in result.stderr
    assert not target.exists()


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",
    "import os\nos.system('echo pwned')",
    "import os\nos.execv('/bin/sh', ['sh'])",
    "import ctypes\nctypes.CDLL(None).fork()",
])
def test_process_creation_is_refused(code):
    result = run(code)
    assert result.exit_code == 1 and "pwned" not in result.stdout
    assert "not allowed" in result.stderr


def test_network_is_unreachable():
    result = run("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert result.exit_code == 1 and "not allowed" in result.stderr
    assert result.isolation["network"] in ("namespace", "audit_hook")


def test_infinite_loop_hits_the_cpu_limit():
    start = time.monotonic()
    result = run("while True:\n    pass")
    assert result.error in ("cpu_limit", "timeout") and time.monotonic() - start < 5


def test_sleeping_forever_hits_the_wall_clock():
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.5))
    assert result.error == "timeout" and "wall-clock" in describe(result)


def test_memory_bomb_fails_cleanly():
    result = run("x = bytearray(2 * 1024**3)")
    assert result.error == "memory_limit" and "MemoryError" in result.stderr


def test_huge_output_is_capped():
    result = run("while True:\n    print('x' * 1000)")
    assert result.error == "output_limit" and result.truncated
    assert len(result.stdout) == LIMITS.max_output_bytes


def test_scratch_dir_is_removed():
    result = run("import os\nprint(os.getcwd())")
    assert result.stdout.strip() and not Path(result.stdout.strip()).exists()


def test_as_root_the_code_runs_as_nobody_when_an_interpreter_allows_it():
    import os

    from agentrl.sandbox import _can_drop_to_nobody

    result = run_python("import os; print(os.getuid())")
    if os.geteuid() == 0 and _can_drop_to_nobody():
        # the kernel's permissions and RLIMIT_NPROC then hold beside the audit hook
        assert result.stdout.strip() == "65534"
        assert result.isolation["user"] == "nobody"
    else:
        assert result.stdout.strip() == str(os.geteuid())
        assert result.isolation["user"] == "same"

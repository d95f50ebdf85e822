"""Concurrent sandboxed calls: each in its own namespaces, none leaking into another or
leaving anything behind."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from agentrl.sandbox import SandboxLimits, run_python
from tests.sandbox.host import processes_with, wait_until

NUM_CALLS = 256
# An unusual scratch size: it appears in every bwrap command line of these calls (and in
# nobody else's), so the host can look for leftovers of exactly these sandboxes.
TRIVIAL = SandboxLimits(scratch_mb=7, wall_s=60.0, cpu_s=30)
TRACE = f"--size\0{7 * 2**20}\0"


def test_256_concurrent_calls_complete_without_leaks():
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=NUM_CALLS) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * {i})", TRIVIAL),
                                range(NUM_CALLS)))
    elapsed = time.monotonic() - start
    print(f"{NUM_CALLS} concurrent sandboxed calls: {elapsed:.1f} s wall")
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(NUM_CALLS)]
    assert all(r.error is None for r in results)
    assert wait_until(lambda: not processes_with(TRACE), 5.0), processes_with(TRACE)


def test_concurrent_calls_cannot_see_or_signal_each_other():
    # A holds a file and a child process in its sandbox; once the host sees that child, B
    # looks for them and tries to kill everything it can reach. A must end normally, its
    # file and child intact.
    marker = "agentrl-holder-" + uuid.uuid4().hex[:12]
    limits = SandboxLimits(wall_s=60.0, cpu_s=10)
    holder = f"""
import os, sys, time
open('mine.txt', 'w').write('A')
child = os.fork()
if child == 0:
    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(5)', {marker!r}])
print('child exit', os.waitpid(child, 0)[1])
print('held until', time.time())
print('A intact', open('mine.txt').read())
"""
    intruder = """
import os, signal, time
print('tmp', os.listdir('/tmp'))
print('procs', sorted(p for p in os.listdir('/proc') if p.isdigit()))
print('looked at', time.time(), flush=True)
for pid in range(1, 400):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""
    outcome = {}
    a = threading.Thread(target=lambda: outcome.setdefault("a", run_python(
        holder, limits, audit_hook=False)))
    a.start()
    assert wait_until(lambda: processes_with(marker), 30.0), "A's child did not start"
    b = run_python(intruder, limits, audit_hook=False)
    a.join()
    a_out = outcome["a"].stdout
    assert float(_after(b.stdout, "looked at")) < float(_after(a_out, "held until"))
    assert "mine.txt" not in b.stdout
    assert "procs ['1', '2']" in b.stdout  # its own init and itself, nothing of A
    assert outcome["a"].error is None and "child exit 0" in a_out and "A intact A" in a_out


def _after(text: str, label: str) -> str:
    return text.split(label + " ", 1)[1].split()[0]

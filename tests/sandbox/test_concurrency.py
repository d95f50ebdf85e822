"""Concurrent sandboxed calls: each in its own namespaces, none leaking into another or
leaving anything behind."""

from __future__ import annotations

import threading
import time
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
    # A holds a file and a process in its sandbox; B, meanwhile, looks for them and tries to
    # kill everything it can reach. A must finish normally, its file intact.
    limits = SandboxLimits(wall_s=20.0, cpu_s=10)
    holder = """
import time
open('mine.txt', 'w').write('A')
print('held from', time.time())
time.sleep(3.0)
print('held until', time.time())
print('A intact', open('mine.txt').read())
"""
    intruder = """
import os, signal, time
print('looked at', time.time())
print('tmp', os.listdir('/tmp'))
print('procs', sorted(p for p in os.listdir('/proc') if p.isdigit()), flush=True)
for pid in range(1, 400):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
"""
    outcome = {}
    a = threading.Thread(target=lambda: outcome.setdefault("a", run_python(holder, limits)))
    a.start()
    time.sleep(1.0)
    b = run_python(intruder, limits, audit_hook=False)
    a.join()
    # B ran while A held its file and process (the same host clock in both)
    held_from, held_until, looked_at = (float(_after(o.stdout, label)) for o, label in (
        (outcome["a"], "held from"), (outcome["a"], "held until"), (b, "looked at")))
    assert held_from < looked_at < held_until
    assert "mine.txt" not in b.stdout
    assert "procs ['1', '2']" in b.stdout  # its own init and itself, nothing of A
    assert outcome["a"].error is None and "A intact A" in outcome["a"].stdout


def _after(text: str, label: str) -> str:
    return text.split(label + " ", 1)[1].split()[0]

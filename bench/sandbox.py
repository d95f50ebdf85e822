"""Per-call cost of the bubblewrap sandbox against the old ``process`` path, and the wall
time of many concurrent calls.

Sequential calls of trivial code ("print(1)") under each isolation, interleaved so that
both see the same machine load; prints the median seconds per call and their ratio, then
the wall time of NUM_CONCURRENT concurrent bwrap calls from as many threads.

    python -m bench.sandbox [--calls 40] [--concurrent 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from agentrl.sandbox import SandboxLimits, bwrap_problem, run_python

LIMITS = SandboxLimits(wall_s=60.0, cpu_s=30)


def one_call(isolation: str) -> float:
    """Seconds for one trivial sandboxed call."""
    start = time.perf_counter()
    result = run_python("print(1)", LIMITS, isolation)
    assert result.stdout == "1\n", result
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40, help="sequential calls per isolation")
    parser.add_argument("--concurrent", type=int, default=256, help="concurrent bwrap calls")
    args = parser.parse_args()
    problem = bwrap_problem()
    if problem is not None:
        raise SystemExit(problem)
    warnings.simplefilter("ignore")
    one_call("bwrap"), one_call("process")  # first use: interpreter lookup, self-test
    times: dict[str, list[float]] = {"bwrap": [], "process": []}
    for _ in range(args.calls):
        for isolation in times:
            times[isolation].append(one_call(isolation))
    bwrap, process = (statistics.median(times[k]) for k in ("bwrap", "process"))
    print(f"per call (median of {args.calls}): bwrap {bwrap * 1000:.0f} ms, "
          f"process {process * 1000:.0f} ms, ratio bwrap/process {bwrap / process:.2f}")
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
        list(pool.map(lambda _: one_call("bwrap"), range(args.concurrent)))
    elapsed = time.perf_counter() - start
    print(f"{args.concurrent} concurrent bwrap calls: {elapsed:.1f} s wall "
          f"({elapsed / args.concurrent * 1000:.0f} ms per call)")


if __name__ == "__main__":
    main()

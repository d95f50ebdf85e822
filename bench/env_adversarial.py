"""Adversarial model text through every built-in environment: escapes, hangs, worst time.

    python bench/env_adversarial.py [--deadline 5] [--envs Countdown,GSM8K]

The texts are ``agentrl.envs.adversarial.cases()``, with tool calls naming each environment's
own tool. Each (environment, text) case runs ``reset(seed=0)`` then ``step(text)`` in a forked
child, so a case that holds the GIL or never returns is measured without stalling the
others: past ``--deadline`` seconds the child is killed and the case counts as a hang.
Prints, per environment, the exceptions that escaped ``step()``, the hangs, the
observations that cannot be encoded as UTF-8 and the rewards that are not finite floats,
then the worst step time and its case. Timings are wall-clock on a shared machine: noisy.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time
from typing import Any

from agentrl.envs.adversarial import cases

ENVS = ("Countdown", "GSM8K", "Calculator", "KVStore", "Python")
TOOLS = {"Calculator": ("calculate", "expression"), "KVStore": ("lookup", "key"),
         "Python": ("run_python", "code")}


def run_case(env_id: str, text: str, conn: Any) -> None:
    """In the child: reset, one step, report what came out."""
    from agentrl.envs.registry import make

    env = make(env_id)
    env.reset(seed=0)
    start = time.perf_counter()
    try:
        observation, reward, *_ = env.step(text)
    except BaseException as exc:  # noqa: BLE001 - we count every escape
        conn.send(("raised", time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:200]))
        return
    seconds = time.perf_counter() - start
    problems = []
    if not (isinstance(reward, float) and math.isfinite(reward)):
        problems.append(f"reward {reward!r}")
    for message in observation:
        try:
            message.content.encode("utf-8")
        except UnicodeEncodeError:
            problems.append("observation not UTF-8")
    conn.send(("ok" if not problems else "bad", seconds, "; ".join(problems)))


def measure(env_id: str, text: str, deadline_s: float) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one case, the child killed past the deadline."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=run_case, args=(env_id, text, child), daemon=True)
    start = time.perf_counter()
    process.start()
    child.close()
    if parent.poll(deadline_s + 2.0):  # + reset and import
        try:
            return parent.recv()
        except EOFError:
            return "died", time.perf_counter() - start, f"exit code {process.exitcode}"
        finally:
            process.join()
    process.kill()
    process.join()
    return "hang", time.perf_counter() - start, f"killed after {deadline_s + 2:g} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds before a hang")
    parser.add_argument("--envs", default=",".join(ENVS))
    args = parser.parse_args()
    import agentrl.envs.registry  # noqa: F401 - import once before forking

    total = {"raised": 0, "hang": 0, "bad": 0, "died": 0, "cases": 0}
    worst = (0.0, "")
    for name in args.envs.split(","):
        env_id = f"agentrl/{name}-v0"
        for case, text in cases(*TOOLS.get(name, ("calculate", "expression"))).items():
            outcome, seconds, detail = measure(env_id, text, args.deadline)
            total["cases"] += 1
            if outcome != "ok":
                total[outcome] += 1
                print(f"{name:>10} {case:<26} {outcome:<6} {seconds:6.2f}s {detail}")
            if outcome in ("ok", "bad", "raised") and seconds > worst[0]:
                worst = (seconds, f"{name} / {case}")
    print(f"cases {total['cases']}: escaped exceptions {total['raised']}, hangs (> "
          f"{args.deadline:g} s) {total['hang']}, died {total['died']}, bad reward or "
          f"observation {total['bad']}; worst completed step {worst[0]:.2f} s ({worst[1]})")


if __name__ == "__main__":
    main()

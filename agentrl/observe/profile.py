"""Where a training step's time goes: named sections, timed only when profiling is on.

``agentrl train --profile`` turns the process-wide :data:`PROFILER` on. Code that matters
for speed wraps its work in ``with section("engine/forward"):`` (a no-op costing one
attribute read when profiling is off); each step's seconds per section land in
``metrics.jsonl`` as ``profile/<section>`` and the run ends with a table of the mean per
step (:func:`format_table`). Sections time wall-clock seconds on the thread that runs
them; environment calls run on their own threads, so they are summed from there.

The sections, in the order a step runs them:

===========================  ==========================================================
``engine/prefill``           admitting requests: slots, prefix copies, prefill forwards
``engine/forward``           batched decode forwards
``engine/sampling``          sampling, stop checks, finishing requests
``rollout/chat_template``    rendering conversations with the chat template
``rollout/tokenizer``        encoding and decoding text
``rollout/env``              environment calls (reset, step, tools, close), on their threads
``rollout/scheduling``       the rest of the generation phase: the runner's Python,
                             asyncio scheduling, waiting on threads (derived)
``train/prepare``            rows, advantages, the rollout sample (the "other" phase)
``train/packing``            packing rows into micro-batches and collating them
``train/forward``            training forwards, log-probs, entropy and the loss (the
                             forward/backward passes less their backward; derived)
``train/backward``           backward passes
``train/optimizer``          gradient clipping, the optimizer and lr schedule steps
``sync``                     weight sync to the engine
===========================  ==========================================================

``--profile-trace STEP`` also records that step with ``torch.profiler`` and writes a
Chrome trace (``RUN_DIR/profile/step_STEP.trace.json``, open it in Perfetto or
chrome://tracing) and the operator table (``step_STEP.ops.txt``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

SECTIONS = (
    "engine/prefill", "engine/forward", "engine/sampling", "rollout/chat_template",
    "rollout/tokenizer", "rollout/env", "rollout/scheduling", "train/prepare",
    "train/packing", "train/forward", "train/backward", "train/optimizer", "sync",
)
GENERATION_SECTIONS = ("engine/prefill", "engine/forward", "engine/sampling",
                       "rollout/chat_template", "rollout/tokenizer", "rollout/env")
"""Measured inside the generation phase; ``rollout/scheduling`` is the phase's rest."""


class Profiler:
    """Seconds per section since the last :meth:`take` (thread-safe)."""

    def __init__(self) -> None:
        """Off until :meth:`enable`."""
        self.enabled = False
        self.trace_step: int | None = None
        """The step ``torch.profiler`` records (``--profile-trace``), or None."""
        self._seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def enable(self, trace_step: int | None = None) -> None:
        """Start timing sections (and trace ``trace_step`` with torch.profiler)."""
        self.enabled, self.trace_step = True, trace_step

    def disable(self) -> None:
        """Stop timing; forget what was timed."""
        self.enabled, self.trace_step = False, None
        self.take()

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` to section ``name`` (from any thread)."""
        with self._lock:
            self._seconds[name] += seconds

    def section(self, name: str) -> Any:
        """A context manager adding its block's wall time to ``name`` (when enabled)."""
        return timed(lambda seconds: self.add(name, seconds)) if self.enabled else nullcontext()

    def take(self) -> dict[str, float]:
        """The seconds per section since the last call, and start again from zero."""
        with self._lock:
            seconds, self._seconds = dict(self._seconds), defaultdict(float)
        return seconds


PROFILER = Profiler()
"""The process's profiler (off unless ``agentrl train --profile`` turned it on)."""


@contextmanager
def timed(add: Callable[[float], None]) -> Iterator[None]:
    """Hand the wall-clock seconds the ``with`` block took to ``add`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(time.perf_counter() - start)


def section(name: str) -> Any:
    """``with section(name):`` times the block into :data:`PROFILER` when it is on."""
    return PROFILER.section(name)


def step_profile(seconds: dict[str, float], phases: dict[str, float]) -> dict[str, float]:
    """``profile/<section>`` figures of one step from the sections' seconds and the step's
    phase times (``time/generate`` ...): ``rollout/scheduling`` is the generation phase's
    time no section claimed, ``train/prepare`` the "other" phase, ``sync`` the sync phase."""
    out = {name: seconds.get(name, 0.0) for name in SECTIONS}
    claimed = sum(out[name] for name in GENERATION_SECTIONS)
    out["rollout/scheduling"] = max(0.0, phases.get("generate", 0.0) - claimed)
    out["train/forward"] = max(0.0, seconds.get("train/forward_backward", 0.0)
                               - out["train/backward"])
    out["train/prepare"] = phases.get("other", 0.0)
    out["sync"] = phases.get("sync", 0.0)
    return {f"profile/{name}": value for name, value in out.items()}


def format_table(steps: list[dict[str, float]]) -> str:
    """The mean seconds per step of every section over ``steps`` (``profile/*`` figures
    of each step), with its share of the step, as text."""
    if not steps:
        return "profile: no step was profiled"
    names = [name for name in SECTIONS if any(f"profile/{name}" in s for s in steps)]
    means = {n: sum(s.get(f"profile/{n}", 0.0) for s in steps) / len(steps) for n in names}
    total = sum(means.values()) or 1.0
    lines = [f"profile: mean of {len(steps)} step(s); seconds per step (share); environment "
             "calls run on their own threads and may overlap the engine",
             f"  {'section':<24}{'s/step':>10}{'share':>9}"]
    lines += [f"  {name:<24}{means[name]:>10.3f}{means[name] / total:>8.1%}" for name in names]
    lines.append(f"  {'total':<24}{total:>10.3f}")
    return "\n".join(lines)


@contextmanager
def traced(step: int, run_dir: Path) -> Iterator[None]:
    """Record the block with ``torch.profiler`` (CPU, and CUDA when present) and write
    the Chrome trace and the operator table of ``step`` under ``run_dir/profile``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    folder = Path(run_dir) / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities, record_shapes=True) as prof:
        yield
    prof.export_chrome_trace(str(folder / f"step_{step}.trace.json"))
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    (folder / f"step_{step}.ops.txt").write_text(table + "\n")

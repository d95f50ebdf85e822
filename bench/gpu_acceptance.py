"""GPU acceptance: the paths a CPU machine cannot run, checked in one short run.

On whatever GPUs it finds (all of one machine), in a few minutes, it trains the quickstart
mix with bf16 compute over fp32 master weights, torch varlen attention, FSDP2 over every GPU
(torchrun), two updates per collection and a KL term, once with the built-in engine and
once with vLLM; resumes the built-in engine's run from its step-2 checkpoint (the metrics
continue, the redone step equals the uninterrupted one) while ranks 1..N wait for slow
collections on rank 0 longer than the collective timeout (``bench/acceptance_resume.py``);
checks engine replicas and weight sync (sleep, weights, wake: ``bench/engine_scaling.py``),
the memory plan against an FSDP2-sharded step (``bench/memory.py``) and a compiled
training step against the eager one (``model.compile``). It prints one
line per check (PASS / FAIL / SKIP with the reason) plus tokens/s, MFU and peak memory.
Exit status 0 only when no check failed; a check whose evidence is missing FAILs.

    python -m bench.gpu_acceptance              # on a GPU machine (pip install -e ".[gpu]")
    python -m bench.gpu_acceptance --dry-run    # on a CPU: same plan and parsing, tiny run

``--dry-run`` runs the same code on the CPU with what the CPU has (fp32, PyTorch attention,
the built-in engine, 2 gloo ranks) so the script cannot rot; a test runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "quickstart.toml"
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
"""Dense bf16 tensor-core peak per GPU (TFLOP/s), by a substring of the device name;
AGENTRL_PEAK_TFLOPS overrides it."""


@dataclass
class Check:
    """One named acceptance check and its outcome."""

    name: str
    status: str = "SKIP"
    detail: str = ""


@dataclass
class Report:
    """Every check and figure of one acceptance run."""

    checks: list[Check] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        """Record a PASS or FAIL."""
        self.checks.append(Check(name, "PASS" if ok else "FAIL", detail))

    def skip(self, name: str, why: str) -> None:
        """Record a check that cannot run here, and why."""
        self.checks.append(Check(name, "SKIP", why))

    def print(self) -> None:
        """The table: one line per check, then the figures."""
        for c in self.checks:
            print(f"[{c.status}] {c.name}" + (f": {c.detail}" if c.detail else ""))
        for name, value in self.figures.items():
            print(f"  {name}: {value}")

    @property
    def failed(self) -> bool:
        """True when any check failed."""
        return any(c.status == "FAIL" for c in self.checks)


@dataclass
class Machine:
    """What the run uses: GPUs (or the CPU in a dry run) and the settings that follow."""

    dry_run: bool
    num_gpus: int
    gpu_name: str

    @property
    def num_ranks(self) -> int:
        """Training ranks: every GPU; 2 gloo ranks on the CPU."""
        return 2 if self.dry_run else self.num_gpus

    def overrides(self, engine: str) -> list[str]:
        """Config overrides of one training run with ``engine``."""
        common = ["train.num_steps=3", "train.eval_every=3",
                  f"train.eval_tasks_per_env={4 if self.dry_run else 64}",
                  "train.checkpoint_every=2", "loss.kl_coef=0.01", "log.live=false",
                  f'rollout.engine="{engine}"']
        if engine == "torch":  # the resume check compares a redone step bit for bit
            common.append("train.deterministic=true")
        if self.dry_run:
            return common + ['model.dtype="float32"', 'model.attention="torch"',
                             "batch.rollout_batch_size=2", "batch.global_batch_size=8",
                             "rollout.max_concurrent_rollouts=16"]
        # CUDA graphs on, as in the shipped configs (no enforce_eager); attention "auto",
        # as shipped: the check below reads which kernel the run announced
        vllm = ['rollout.vllm_args={ gpu_memory_utilization = 0.3 }']
        return common + ['model.dtype="bfloat16"', 'model.attention="auto"'] + (
            vllm if engine == "vllm" else [])

    @property
    def attention(self) -> str:
        """The start-up line the run must print: torch's varlen kernel on a GPU, the exact
        per-row path on the CPU."""
        return ("attention: PyTorch SDPA per row" if self.dry_run
                else "attention: torch varlen_attn (bfloat16)")


def detect(dry_run: bool) -> Machine:
    """The GPUs of this machine (refuses to run without one unless ``dry_run``)."""
    import torch

    if dry_run:
        return Machine(True, 0, "cpu (dry run)")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device found; run on a GPU machine, or pass --dry-run on a CPU")
    return Machine(False, torch.cuda.device_count(), torch.cuda.get_device_name(0))


def train(machine: Machine, engine: str, out: Path, extra: list[str] | None = None,
          resume: bool = False) -> tuple[int | None, str, list[dict[str, Any]]]:
    """One torchrun training run (``extra`` overrides after the machine's; ``resume``:
    from ``out``'s newest checkpoint); returns (exit status, None on a timeout; its
    output; its metrics)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(machine.num_ranks), "-m", "agentrl", "train",
               str(CONFIG), "--out", str(out)] + (["--resume"] if resume else [])
    for override in machine.overrides(engine) + (extra or []):
        command += ["--set", override]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=900)
    except subprocess.TimeoutExpired as timed_out:  # a FAIL to report, not a crash
        output = [o.decode() if isinstance(o, bytes) else o or ""
                  for o in (timed_out.stdout, timed_out.stderr)]
        return None, "".join(output) + "\n(timed out after 900 s)", []
    log = proc.stdout + proc.stderr
    metrics_file = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()
               ] if metrics_file.exists() else []
    return proc.returncode, log, records


def failure(log: str) -> str:
    """What a failed run said: its ranks' error lines (torchrun's own summary names no
    cause), then the end of its output."""
    errors = [line.strip() for line in log.splitlines()
              if "Error:" in line and "ChildFailedError" not in line]
    return " | ".join(errors[-3:]) + "\n" + log[-1500:]


def check_training(report: Report, machine: Machine, engine: str, out: Path
                   ) -> list[dict[str, Any]]:
    """Train with ``engine`` and record its checks and figures; its step records ([] when
    it failed)."""
    start = time.perf_counter()
    status, log, records = train(machine, engine, out)
    wall = time.perf_counter() - start
    tag = f"[{engine}]"
    report.check(f"{tag} torchrun training over {machine.num_ranks} ranks exits 0",
                 status == 0, f"{wall:.0f}s" if status == 0 else failure(log))
    if status != 0:
        return []
    steps = [r for r in records if r.get("step", 0) > 0 and "loss/policy_loss" in r]
    report.check(f"{tag} three training steps in metrics.jsonl", len(steps) == 3,
                 f"{len(steps)} steps")
    if not steps:
        return []
    report.check(f"{tag} FSDP2 over every rank", f"ranks: {machine.num_ranks}" in log)
    report.check(f"{tag} attention kernel as announced", machine.attention in log,
                 f"expected {machine.attention!r}")
    report.check(f"{tag} two updates per collection",
                 records[-1].get("cumulative/updates") == 2 * len(steps))
    report.check(f"{tag} KL term active and finite losses",
                 any(r.get("loss/kl_loss", 0.0) > 0 for r in steps)
                 and all(abs(r["loss/policy_loss"]) < 1e6 for r in steps))
    mismatches = [r["loss/mismatch_scored"] for r in steps if "loss/mismatch_scored" in r]
    report.check(f"{tag} engine and trainer log-probs agree",
                 bool(mismatches) and max(mismatches) < 0.05,
                 f"max mean |Δ log p| {max(mismatches):.4f}" if mismatches
                 else "loss/mismatch_scored missing from every step")
    written = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    report.check(f"{tag} checkpoints written", written == ["step_2", "step_3"],
                 f"{written}")
    add_figures(report, machine, engine, steps)
    return steps


def add_figures(report: Report, machine: Machine, engine: str,
                steps: list[dict[str, Any]]) -> None:
    """tokens/s (generation and training), MFU and peak memory of a run."""
    sampled = sum(r["num_sampled_tokens"] for r in steps)
    trained = sum(r["num_trainable_tokens"] for r in steps)
    t_gen = sum(r["time/generate"] for r in steps)
    t_train = sum(r["time/train"] for r in steps)
    flops = sum(r.get("perf/train_flops", 0.0) for r in steps)
    if engine == "torch":  # every slot decoded every step (the resume check needs it)
        engine = "torch (train.deterministic)"
    report.figures[f"{engine}: generation tokens/s"] = f"{sampled / max(t_gen, 1e-9):,.0f}"
    report.figures[f"{engine}: training tokens/s"] = f"{trained / max(t_train, 1e-9):,.0f}"
    peak = peak_tflops(machine)
    if peak:
        mfu = flops / max(t_train, 1e-9) / (peak * 1e12 * machine.num_ranks)
        report.figures[f"{engine}: MFU (training phase)"] = f"{100 * mfu:.2f}%"
    memory = [r["memory/peak_allocated_gib"] for r in steps if "memory/peak_allocated_gib" in r]
    if memory:
        report.figures[f"{engine}: peak GPU memory, rank 0"] = f"{max(memory):.2f} GiB"


def peak_tflops(machine: Machine) -> float | None:
    """The GPU's dense bf16 peak (TFLOP/s), or None when unknown (no MFU then)."""
    if "AGENTRL_PEAK_TFLOPS" in os.environ:
        return float(os.environ["AGENTRL_PEAK_TFLOPS"])
    return next((v for k, v in PEAK_TFLOPS.items() if k in machine.gpu_name), None)


def vllm_ready(machine: Machine) -> str | None:
    """Why the vLLM run cannot happen here, or None."""
    if machine.dry_run:
        return "dry run on the CPU (the vLLM CPU path is tested by .ci/vllm)"
    from agentrl.engines.vllm_setup import vllm_available

    return None if vllm_available() else "vllm is not installed (pip install agentrl[gpu])"


def engine_checks(report: Report, machine: Machine, scratch: Path) -> None:
    """Engine replicas and weight sync (``bench.engine_scaling``): vLLM over NCCL and CUDA
    IPC on GPUs; two `agentrl serve` replicas over gloo in a dry run; colocated replicas
    synced as in training (sleep, weights, wake)."""
    from bench.engine_scaling import gpu_checks

    gpu_checks(report, dry_run=machine.dry_run)


def memory_checks(report: Report, machine: Machine, scratch: Path) -> None:
    """Peak CUDA memory of an FSDP2-sharded 1.5B update over every GPU against the memory
    plan's training-phase terms (``bench.memory``); a dry run shards the quickstart's
    model over 2 gloo ranks and skips the CUDA figure alone."""
    from bench.memory import memory_check

    memory_check(report, machine, scratch)


def compile_checks(report: Report, machine: Machine, scratch: Path) -> None:
    """``model.compile`` on the GPU: a compiled training step of the quickstart model in
    bf16 with the varlen kernel matches the eager one, a pack of other row lengths
    reuses the compilation, and the figure says what it saves (the CPU's agreement is
    tests/model/test_compile.py's; the dry run skips the minutes inductor needs)."""
    name = "[compile] compiled training step equals eager, no recompile on a new pack"
    if machine.dry_run:
        report.skip(name, "dry run on the CPU (tests/model/test_compile.py checks it there)")
        return
    try:
        ok, detail, speedup = compile_agreement("cuda", "bfloat16")
    except Exception as exc:  # noqa: BLE001 - a FAIL to report, not a crash
        report.check(name, False, f"{type(exc).__name__}: {exc}")
        return
    report.check(name, ok, detail)
    report.figures["compile: training step, eager / compiled"] = f"{speedup:.2f}x"


def compile_agreement(device: str, dtype: str, repeats: int = 5) -> tuple[bool, str, float]:
    """Eager and compiled copies of the quickstart model on ``device``: loss and gradient
    agreement on two packs of different row lengths (the second must not recompile),
    then the eager / compiled seconds of ``repeats`` more steps."""
    import copy

    import torch
    import torch._dynamo

    from agentrl.model import load_pretrained
    from agentrl.model.compile import compile_model

    attention = "varlen" if device == "cuda" else "torch"
    eager = load_pretrained(ROOT / "assets" / "quickstart-sft", getattr(torch, dtype),
                            attention, device)
    compiled = copy.deepcopy(eager)
    compile_model(compiled)

    def step(model: Any, lengths: list[int], seed: int) -> tuple[float, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (1, sum(lengths)), generator=gen)
        cu = torch.tensor([0, *lengths]).cumsum(0)
        keep = torch.arange(0, sum(lengths), 2)
        model.zero_grad(set_to_none=True)
        scores = model(ids.to(device), cu_seqlens=cu.to(device), targets=ids.roll(-1, 1).to(
            device), positions=keep.to(device), bounds=cu.tolist())
        loss = -scores.logprobs.reshape(-1)[keep.to(device)].float().mean()
        loss.backward()
        grads = torch.cat([p.grad.float().reshape(-1) for p in model.parameters()])
        return loss.detach().item(), grads

    worst = 0.0
    packs = [[70, 95, 110, 64], [88, 120, 71, 90, 101, 66]]
    for i, lengths in enumerate(packs):
        loss, grads = step(eager, lengths, i)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            compiled_loss, compiled_grads = step(compiled, lengths, i)
        cosine = float(torch.nn.functional.cosine_similarity(grads, compiled_grads, dim=0))
        worst = max(worst, abs(compiled_loss - loss) / max(abs(loss), 1e-9), 1.0 - cosine)
    seconds = {}
    for label, model in (("eager", eager), ("compiled", compiled)):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for r in range(repeats):
            step(model, packs[r % 2], r)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds[label] = time.perf_counter() - start
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-4
    return (worst < tolerance,
            f"worst relative loss gap / (1 - gradient cosine) {worst:.2e} (< {tolerance:g})",
            seconds["eager"] / seconds["compiled"])


EXTRA_CHECKS: list[Callable[[Report, Machine, Path], None]] = [engine_checks, memory_checks,
                                                               compile_checks]
"""Further GPU checks (engine replicas and weight sync, the memory plan, torch.compile);
each gets the report, the machine and a scratch folder."""


def main(argv: list[str] | None = None) -> int:
    """Run every check and print the report; 1 when a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run the same plan on the CPU (tiny, no flash-attn, no vLLM)")
    args = parser.parse_args(argv)
    machine = detect(args.dry_run)
    report = Report()
    report.figures["machine"] = f"{machine.num_gpus} x {machine.gpu_name}"
    with tempfile.TemporaryDirectory(prefix="agentrl-acceptance-") as scratch:
        steps = check_training(report, machine, "torch", Path(scratch) / "torch")
        from bench.acceptance_resume import check_resume

        check_resume(report, machine, Path(scratch) / "torch", steps, train)
        why = vllm_ready(machine)
        if why is None:
            check_training(report, machine, "vllm", Path(scratch) / "vllm")
        else:
            report.skip("[vllm] training with vLLM generating", why)
        for extra in EXTRA_CHECKS:
            extra(report, machine, Path(scratch))
    report.print()
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

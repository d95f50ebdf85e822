"""Engine replicas: rollouts/s with 1, 2 and 4 `agentrl serve` replicas, and weight-sync
seconds per GB; plus the GPU checks that ``bench/gpu_acceptance.py`` runs.

    python -m bench.engine_scaling [--rollouts 64] [--latency-ms 100] [--sync-mb 400] [--hidden 256]
    python -m bench.engine_scaling --gpu [--dry-run]

CPU figures: each replica is its own `agentrl serve` process (built-in engine, one torch
thread) on this machine; the trainer side (router, runner, HTTP client, environments) runs
here. A machine with C cores can scale compute-bound generation by about min(N, C)
(fewer, with the trainer side sharing the cores); an environment whose steps wait on a
tool (``--latency-ms``) shows the router keeping replicas busy while rollouts wait.
Weight sync pushes a model of ``--sync-mb`` (fp32) to 1 and 2 servers over gloo (HTTP
control plane, the same path as to vLLM servers), timed.

``gpu_checks(report, dry_run)`` is what the acceptance script calls: on GPUs, vLLM
replicas with NCCL (separate GPUs) and CUDA IPC (colocated) weight sync, version and
greedy-token checks, sleep freeing memory, seconds per GB; with ``dry_run`` the same
sequence on two `agentrl serve` processes (gloo), so it cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.config import config_from_dict
from agentrl.engines.interface import SamplingParams
from agentrl.engines.remote import RemoteEngine
from agentrl.engines.router import EngineRouter
from agentrl.engines.spawn import spawn_servers
from agentrl.engines.torch_engine import TorchEngine
from agentrl.model import build_tiny_checkpoint, load_pretrained, load_tokenizer
from agentrl.rollout.runner import RolloutRunner
from agentrl.sampler import EnvironmentSampler
from agentrl.types import Message

SERVE = """
[model]
path = "{model}"
[rollout]
max_concurrent_rollouts = {slots}
[[environments]]
id = "agentrl/Countdown-v0"
"""


class ToolLatencyEnv:
    """``horizon`` turns; each step waits ``latency_s`` (a tool call) before answering."""

    def __init__(self, horizon: int, latency_s: float) -> None:
        self.horizon = horizon
        self.latency_s = latency_s
        self.turn = 0

    def tool_schemas(self) -> list[dict]:
        """No tools offered: the latency stands for one."""
        return []

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """A task message."""
        self.turn = 0
        return [Message("user", f"Task {seed}: call the tool {self.horizon} times.")], {}

    async def astep(self, action: str):
        """Wait for the 'tool', then report; the episode ends at the horizon."""
        await asyncio.sleep(self.latency_s)
        self.turn += 1
        done = self.turn >= self.horizon
        return ([] if done else [Message("user", f"result {self.turn}")]), 0.0, done, False, {}


def rollouts_per_second(engines: list[Any], tokenizer: Any, rollouts: int,
                        latency_s: float) -> float:
    """One collection of ``rollouts`` 3-turn rollouts over the given replicas."""
    config = config_from_dict({
        "environments": [{"id": "bench:ToolLatencyEnv", "name": "tool"}],
        "batch": {"rollout_batch_size": rollouts // 4, "n_samples_per_prompt": 4,
                  "global_batch_size": rollouts},
        "rollout": {"max_new_tokens": 16, "max_turns": 3, "max_concurrent_rollouts": rollouts,
                    "step_timeout_s": 60},
    })
    router = EngineRouter(engines)
    runner = RolloutRunner(config, router, tokenizer, EnvironmentSampler({"tool": 1.0}, 0),
                           make_env=lambda _: ToolLatencyEnv(3, latency_s))
    start = time.perf_counter()
    result = asyncio.run(runner.collect(0, rollouts))
    seconds = time.perf_counter() - start
    assert all(r.valid for r in result.rollouts), [r.stats.error for r in result.rollouts]
    return len(result.rollouts) / seconds


def sync_seconds_per_gb(urls: list[str], model: torch.nn.Module) -> tuple[float, float]:
    """(seconds, seconds per GB sent to each replica) of one sync to all ``urls``."""
    router = EngineRouter([RemoteEngine(url, sync_timeout_s=600).connect() for url in urls])
    router.update_weights(((n, p.detach()) for n, p in model.named_parameters()))  # joins
    start = time.perf_counter()
    router.update_weights(((n, p.detach()) for n, p in model.named_parameters()))
    seconds = time.perf_counter() - start
    gigabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    return seconds, seconds / gigabytes


def scaling(args: argparse.Namespace, tmp: Path) -> None:
    """Rollouts/s with 1, 2, 4 replicas, without and with tool latency."""
    model_dir = build_tiny_checkpoint(tmp / "tiny", hidden_size=args.hidden, num_layers=4,
                                      vocab_size=400)
    config = tmp / "serve.toml"
    config.write_text(SERVE.format(model=model_dir, slots=args.rollouts))
    servers = spawn_servers(config, 4, threads=1)
    tokenizer = load_tokenizer(model_dir)
    local = TorchEngine(load_pretrained(model_dir, attention="torch").eval(), tokenizer,
                        max_batch_size=args.rollouts, max_len=1024)
    try:
        for latency_ms in (0, args.latency_ms):
            def best(engines: list[Any], latency_s: float = latency_ms / 1000) -> float:
                return max(rollouts_per_second(engines, tokenizer, args.rollouts, latency_s)
                           for _ in range(args.repeats))

            in_process = best([local])
            print(f"tool latency {latency_ms:4d} ms, in-process engine: {in_process:7.2f} "
                  "rollouts/s (no HTTP; the baseline of the protocol's cost)", flush=True)
            base = None
            for n in (1, 2, 4):
                rate = best([RemoteEngine(s.url).connect() for s in servers[:n]])
                base = base or rate
                print(f"tool latency {latency_ms:4d} ms, {n} replica(s): {rate:7.2f} rollouts/s"
                      f"  scaling {rate / base:4.2f}x", flush=True)
    finally:
        for server in servers:
            server.stop()


def sync_figures(args: argparse.Namespace, tmp: Path) -> None:
    """Seconds per GB of a gloo weight sync to 1 and 2 servers."""
    hidden = 1024
    layers = max(1, round(args.sync_mb * 2**20 / 4 / (12 * hidden * hidden)))
    model_dir = build_tiny_checkpoint(tmp / "big", hidden_size=hidden, num_layers=layers,
                                      num_heads=8, num_kv_heads=4, vocab_size=512)
    model = load_pretrained(model_dir, attention="torch")
    config = tmp / "serve_big.toml"
    config.write_text(SERVE.format(model=model_dir, slots=1))
    servers = spawn_servers(config, 2, threads=1)
    try:
        for n in (1, 2):
            seconds, per_gb = sync_seconds_per_gb([s.url for s in servers[:n]], model)
            size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
            print(f"weight sync over gloo, {size:.0f} MiB to {n} replica(s): {seconds:.2f} s "
                  f"= {per_gb:.2f} s/GB per replica", flush=True)
    finally:
        for server in servers:
            server.stop()


# ----------------------------------------------------------------------------- GPU checks


def gpu_checks(report: Any, dry_run: bool = False) -> None:
    """Engine checks for the GPU acceptance run, recorded on ``report`` (``check(name, ok,
    detail)``, ``skip(name, why)``, ``figures``): replicas serve new weights after a sync
    (version bumped, greedy tokens change and come back), seconds per GB, sleep frees
    memory. GPU: vLLM replicas, NCCL (separate GPUs) and CUDA IPC (colocated). Dry run:
    two `agentrl serve` processes over gloo."""
    with tempfile.TemporaryDirectory() as tmp:
        if dry_run:
            _dry_run_checks(report, Path(tmp))
        else:
            _vllm_checks(report, Path(tmp))


def _dry_run_checks(report: Any, tmp: Path) -> None:
    model_dir = build_tiny_checkpoint(tmp / "m", hidden_size=64, vocab_size=400, seed=0)
    config = tmp / "serve.toml"
    config.write_text(SERVE.format(model=model_dir, slots=8))
    servers = spawn_servers(config, 2, threads=1)
    try:
        replicas = [RemoteEngine(s.url, sync_timeout_s=120).connect() for s in servers]
        _sync_checks(report, "[engines] 2 agentrl serve replicas, gloo", EngineRouter(replicas),
                     model_dir, lambda: replicas[0].served_version())
        def asleep() -> bool:
            return all(r._get("/is_sleeping")["is_sleeping"] for r in replicas)

        _sync_checks(report, "[engines] colocated agentrl serve replicas, gloo, after sleep",
                     EngineRouter(replicas, colocated=True), model_dir,
                     lambda: replicas[0].served_version(), SleepProbe(replicas, asleep))
    finally:
        for server in servers:
            server.stop()


def _vllm_checks(report: Any, tmp: Path) -> None:
    from agentrl.engines.vllm_engine import VLLMEngine
    from agentrl.engines.vllm_setup import vllm_available

    if not vllm_available():
        report.skip("[engines] vLLM replicas", "vllm is not installed (pip install -e '.[gpu]')")
        return
    # ~0.5 B parameters in bf16 (~1 GB): large enough for a seconds-per-GB figure
    model_dir = build_tiny_checkpoint(tmp / "m", hidden_size=1536, num_layers=16, num_heads=12,
                                      num_kv_heads=4, vocab_size=2048, dtype=torch.bfloat16)
    common = dict(dtype="bfloat16", enforce_eager=True, gpu_memory_utilization=0.25,
                  max_model_len=512, sync_timeout_s=300.0)
    count = torch.cuda.device_count()
    torch.cuda.set_device(0)  # this process is the trainer, on GPU 0
    if count >= 2:
        separate = [VLLMEngine.from_pretrained(model_dir, gpus=[g], weight_transport="nccl",
                                               name=f"vLLM replica on GPU {g}", **common)
                    for g in range(1, min(count, 3))]
        try:
            _sync_checks(report, f"[engines] {len(separate)} vLLM replica(s), NCCL",
                         EngineRouter(separate), model_dir, separate[0].served_version)
        finally:
            for engine in separate:
                engine.shutdown()
    else:
        report.skip("[engines] vLLM replicas on separate GPUs, NCCL", "needs 2 GPUs")
    colocated = VLLMEngine.from_pretrained(model_dir, gpus=[0], weight_transport="ipc",
                                           sleep_mode=True, name="colocated vLLM replica",
                                           **common)
    try:
        router = EngineRouter([colocated], colocated=True, sleep_level=1)
        _sync_checks(report, "[engines] colocated vLLM replica, CUDA IPC, after sleep", router,
                     model_dir, colocated.served_version,
                     SleepProbe([colocated], None, lambda: torch.cuda.mem_get_info(0)[0]))
    finally:
        colocated.shutdown()


class SleepProbe:
    """A colocated router's replicas, watched through sleep → weights → wake: every
    ``wake_up`` call's tags (recorded), whether the KV caches are freed (``asleep``, None
    where the replica cannot say) and free GPU memory (``free_bytes``, None on the CPU)."""

    def __init__(self, replicas: list[Any], asleep: Callable[[], bool] | None,
                 free_bytes: Callable[[], int] | None = None) -> None:
        self.asleep, self.free_bytes = asleep, free_bytes
        self.wakes: list[list[str] | None] = []
        for replica in replicas:
            def recorded(tags: list[str] | None = None, wake: Any = replica.wake_up) -> None:
                self.wakes.append(None if tags is None else list(tags))
                wake(tags)

            replica.wake_up = recorded

    def free(self) -> int | None:
        """Free GPU memory now (bytes), or None on the CPU."""
        return None if self.free_bytes is None else self.free_bytes()


def _sync_checks(report: Any, label: str, router: EngineRouter, model_dir: Path,
                 served_version: Callable[[], int], sleep: SleepProbe | None = None) -> None:
    """Sync other weights (version +1: greedy tokens change), then the original ones back
    (+2: the original tokens return); record seconds per GB. With ``sleep`` (a colocated
    router) each sync comes as in training: the replicas sleep, the sync wakes their
    weights alone, the next generation wakes the rest (:func:`_sleep_checks`)."""
    original = load_pretrained(model_dir, attention="torch")
    other = load_pretrained(model_dir, attention="torch")
    with torch.no_grad():  # sharper, different weights: other greedy paths
        for name, param in other.named_parameters():
            if not name.endswith("norm.weight"):
                param.mul_(-10.0)
    before = _greedy(router)
    start_version = router.weight_version
    moments = []
    for weights in (other, original):
        moment: dict[str, Any] = {"awake": sleep.free() if sleep else None}
        if sleep is not None:
            router.release_memory()
            moment.update(slept=sleep.free(), asleep=sleep.asleep and sleep.asleep())
        moment["seconds"] = _timed_sync(router, weights)
        if sleep is not None:
            moment.update(synced=sleep.free(), still_asleep=sleep.asleep and sleep.asleep())
        moment["tokens"] = _greedy(router)
        moment["woken"] = sleep.free() if sleep else None
        moments.append(moment)
    changed, back = moments[0]["tokens"], moments[1]["tokens"]
    gigabytes = sum(p.numel() * p.element_size() for p in original.parameters()) / 1e9
    report.check(f"{label}: every replica serves the new weights",
                 changed != before and back == before
                 and router.weight_version == served_version() == start_version + 2,
                 f"versions {start_version} -> {router.weight_version}")
    report.figures[f"{label}: weight sync s/GB"] = f"{moments[0]['seconds'] / gigabytes:.2f}"
    if sleep is not None:
        _sleep_checks(report, label, sleep, moments, len(router.replicas))


def _sleep_checks(report: Any, label: str, sleep: SleepProbe, moments: list[dict[str, Any]],
                  num_replicas: int) -> None:
    """Each sync woke only the weights and the generation after it the rest, in that
    order; where the replica says, its KV cache stayed freed through the sync; on a GPU
    sleeping freed memory and the KV cache came back only with the generation."""
    want = [["weights"]] * num_replicas + [None] * num_replicas
    report.check(f"{label}: the sync wakes only the weights, the generation the rest",
                 sleep.wakes == want * len(moments), f"wake_up calls {sleep.wakes}")
    if sleep.asleep is not None:
        report.check(f"{label}: the KV cache stays freed through the sync",
                     all(m["asleep"] and m["still_asleep"] for m in moments),
                     f"asleep before / after each sync: "
                     f"{[(m['asleep'], m['still_asleep']) for m in moments]}")
    name = f"{label}: sleep frees GPU memory, the sync takes back the weights alone"
    if sleep.free_bytes is None:
        report.skip(name, "no CUDA device (free GPU memory cannot be read)")
        return
    gib = 2**30
    freed = [(m["slept"] - m["awake"]) / gib for m in moments]
    kv = [(m["synced"] - m["woken"]) / gib for m in moments]
    report.check(name, all(f > 1 for f in freed) and all(k > 1 for k in kv),
                 f"sleep freed {', '.join(f'{f:.1f}' for f in freed)} GiB; the generation "
                 f"after each sync took {', '.join(f'{k:.1f}' for k in kv)} GiB more (its "
                 "KV cache: > 1 GiB means the sync had not woken it)")


def _timed_sync(router: EngineRouter, model: torch.nn.Module) -> float:
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    router.update_weights((n, p.detach().to(device)) for n, p in model.named_parameters())
    return time.perf_counter() - start


def _greedy(router: EngineRouter) -> list[list[int]]:
    prompts = [[5, 17, 200, 33], [40, 2, 9, 11]]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)

    async def run() -> list[list[int]]:
        gens = await asyncio.gather(*(router.generate(p, greedy, key=f"k{i}")
                                      for i, p in enumerate(prompts)))
        return [g.token_ids for g in gens]

    return asyncio.run(run())


class _Printed:
    """A minimal report for running the GPU checks on their own."""

    def __init__(self) -> None:
        self.figures: dict[str, str] = {}
        self.failed = False

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.failed |= not ok
        print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))

    def skip(self, name: str, why: str) -> None:
        print(f"[SKIP] {name}: {why}")


def main() -> int:
    """CPU figures, or the GPU checks with --gpu."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--latency-ms", type=int, default=100)
    parser.add_argument("--sync-mb", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden size of the 4-layer model the replicas generate with")
    parser.add_argument("--repeats", type=int, default=2,
                        help="collections per setting; the fastest counts (shared machines)")
    parser.add_argument("--gpu", action="store_true", help="run the GPU acceptance checks")
    parser.add_argument("--dry-run", action="store_true", help="with --gpu: on the CPU")
    args = parser.parse_args()
    if args.gpu:
        report = _Printed()
        gpu_checks(report, dry_run=args.dry_run)
        for name, value in report.figures.items():
            print(f"  {name}: {value}")
        return int(report.failed)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        scaling(args, Path(tmp))
        sync_figures(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

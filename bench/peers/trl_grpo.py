"""agentrl against Hugging Face TRL's GRPOTrainer on the same work, side by side in one run.

Both train the earlier quickstart warm start (``assets/calc-countdown-sft``) on tasks of one
agentrl environment graded by it (Countdown in one turn, or ``--env calculator``: word
problems over a ``calculate`` tool, up to 3 turns as in ``configs/calc_countdown.toml``;
TRL through its own tool calling with the same tool schema), with the same batch
(prompts × samples completions per optimizer step, one update per collection), lr,
token-level loss (TRL ``loss_type = "dapo"``), group-normalized advantages, no KL,
temperature 1. Prints steps per minute,
agentrl's generate/train split, peak resident memory and mean reward of each, and the
agentrl / TRL ratio; over several ``--seeds`` the ratios' median, least, and geometric mean
with its 95% interval (each seed runs both frameworks one after the other, so the pair
shares the machine's load). TRL runs in its own venv (``--trl-venv``, default ``.venv-trl``),
created with ``pip install trl==1.16.0 torch==2.13.0 msgspec gymnasium`` when missing.

    python -m bench.peers.trl_grpo                 # 20 steps, 16 prompts x 8 samples
    python -m bench.peers.trl_grpo --shape large   # 6 steps of a random 8-layer model
    python -m bench.peers.trl_grpo --env calculator  # multi-turn tool calling
    python -m bench.peers.trl_grpo --quick         # 2 steps of 4 x 4: checks that it runs

``--shape large`` is ``bench.shapes``' random 8-layer, 512-hidden decoder with the warm
start's tokenizer: nearly every completion runs the full 40 tokens. Note ``uptime`` when
you measure.

``--precision`` sets what each side computes in (each run prints what it used):
``default`` leaves both at their own defaults, which differ on a CPU: agentrl computes
in float32 there (``model.dtype = "auto"``), while TRL's GRPOConfig turns on bf16 mixed
precision (autocast; on a CPU with AMX its matmuls run ~7x faster than float32) and
gradient checkpointing. ``fp32`` and ``bf16`` match them: agentrl ``model.dtype`` float32
or bfloat16 (fp32 master weights either way), TRL ``bf16`` False or True. TRL keeps its
gradient checkpointing in every mode: turning it off made TRL slower here (bf16, large
shape: 102 s against 70 s for 6 steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.shapes import SMALL, write_large_checkpoint

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_trl_worker.py")
# What each environment's rollout may do. agentrl caps generated tokens per turn and per
# rollout; TRL caps one completion: its generated tokens and the tool results between them.
ENVS = {
    "countdown": {"env_id": "agentrl/Countdown-v0", "env_kwargs": {"num_numbers": 2,
                  "max_number": 9}, "max_turns": 1, "rollout_tokens": 40,
                  "trl_completion_tokens": 40},
    "calculator": {"env_id": "agentrl/Calculator-v0", "env_kwargs": {"num_operations": 1,
                   "max_number": 9}, "max_turns": 3, "rollout_tokens": 120,
                   "trl_completion_tokens": 160},
}

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = {prompts}
n_samples_per_prompt = {samples}
global_batch_size = {batch}
max_tokens_per_microbatch = {microbatch_tokens}
[optim]
lr = {lr}
[rollout]
temperature = 1.0
max_new_tokens = {max_new_tokens}
max_turns = {max_turns}
max_rollout_tokens = {rollout_tokens}
max_concurrent_rollouts = {batch}
[train]
num_steps = {steps}
seed = {seed}
[log]
live = false
rollouts_every = 0
[[environments]]
id = "{env_id}"
kwargs = {env_toml}
"""

PRECISIONS = {
    "default": ([], {}),
    "fp32": (["model.dtype=float32"], {"bf16": False}),
    "bf16": (["model.dtype=bfloat16"], {"bf16": True}),
}
"""Per ``--precision``: agentrl's config overrides and TRL's GRPOConfig overrides."""

AGENTRL_RUN = """
import json, resource, sys, time
from agentrl.cli import main
start = time.perf_counter()
assert main(sys.argv[1:]) == 0
print(json.dumps({"wall_s": time.perf_counter() - start,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def trl_python(venv: Path) -> Path:
    """The TRL venv's python, creating the venv when it is missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "trl==1.16.0",
                        "torch==2.13.0", "msgspec", "gymnasium"], check=True)
    return python


def run_agentrl(spec: dict, folder: Path) -> dict:
    """``agentrl train`` on the spec in a child process; its timings from metrics.jsonl."""
    config = folder / "agentrl.toml"
    env_toml = "{ " + ", ".join(f"{k} = {v!r}" for k, v in spec["env_kwargs"].items()) + " }"
    config.write_text(CONFIG.format(batch=spec["prompts"] * spec["samples"],
                                    env_toml=env_toml, **spec))
    out = folder / "agentrl-run"
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    overrides = [arg for setting in spec["agentrl_set"] for arg in ("--set", setting)]
    done = subprocess.run([sys.executable, "-c", AGENTRL_RUN, "train", str(config), "--out",
                           str(out), *overrides], env=env, cwd=ROOT, check=True,
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["precision"] = next((line[line.index("compute dtype"):] for line in
                                done.stdout.splitlines() if "compute dtype" in line), "unknown")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "time/generate" in s]
    step_s = sum(s["time/generate"] + s["time/train"] + s["time/sync"] + s["time/other"]
                 for s in steps)
    return {"step_s": step_s, "generate_s": sum(s["time/generate"] for s in steps),
            "train_s": sum(s["time/train"] for s in steps), "steps": len(steps),
            "reward": sum(s["reward/mean"] for s in steps) / len(steps), **result}


def run_trl(spec: dict, folder: Path, python: Path) -> dict:
    """TRL's GRPOTrainer on the spec in its venv; ``trainer.train()``'s seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(spec["threads"])}
    done = subprocess.run([str(python), str(WORKER), json.dumps({**spec, "out": str(
        folder / "trl-run")})], env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["reward"] = sum(result["rewards"]) / max(1, len(result["rewards"]))
    return result


def trl_precision(used: dict) -> str:
    """What TRL computed in, as the worker read it from its trainer."""
    mixed = used["mixed_precision"]
    return ({"bf16": "bf16 mixed precision (autocast)", "no": "float32"}.get(mixed, mixed)
            + (", gradient checkpointing" if used["gradient_checkpointing"] else ""))


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t 0.975 quantiles for 1 to 10 degrees of freedom."""


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of per-seed speed ratios and its 95% interval (Student's t over
    their logarithms: each seed pairs one run of each framework under the same load).
    Past 10 degrees of freedom the t quantile comes from its Cornish-Fisher expansion."""
    logs = [math.log(r) for r in ratios]
    centre = statistics.mean(logs)
    df = len(logs) - 1
    z = 1.959964
    t = T_975[df - 1] if df <= len(T_975) else (
        z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2))
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def main() -> None:
    """Run both on the same spec, agentrl first, once per seed, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 steps of 4 prompts x 4")
    parser.add_argument("--shape", choices=["small", "large"], default="small")
    parser.add_argument("--env", choices=sorted(ENVS), default="countdown",
                        help="calculator: multi-turn, TRL through its tool calling")
    parser.add_argument("--steps", type=int, help="default 20 (small) or 6 (large)")
    parser.add_argument("--seeds", type=int, default=1, help="runs of each, seeds 0, 1, ...")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--microbatch-tokens", type=int, default=4096,
                        help="agentrl's batch.max_tokens_per_microbatch (its default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an agentrl config override (e.g. model.compile=true)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="default",
                        help="default: each framework's own (they differ on a CPU); fp32 or "
                             "bf16: both compute in it")
    parser.add_argument("--trl-venv", type=Path, default=ROOT / ".venv-trl")
    args = parser.parse_args()
    steps = args.steps or {"small": 20, "large": 6}[args.shape]
    prompts, samples, steps = (4, 4, 2) if args.quick else (16, 8, steps)
    agentrl_set, trl_config = PRECISIONS[args.precision]
    spec = {"prompts": prompts, "samples": samples, "steps": steps, "lr": 3e-4,
            "max_new_tokens": 40, "threads": args.threads,
            "agentrl_set": agentrl_set + args.set, "trl_config": trl_config,
            "microbatch_tokens": args.microbatch_tokens, **ENVS[args.env]}
    python = trl_python(args.trl_venv)
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        spec["model"] = str(SMALL if args.shape == "small"
                            else write_large_checkpoint(Path(tmp) / "large"))
        for seed in range(args.seeds):
            folder = Path(tmp) / f"seed{seed}"
            folder.mkdir()
            runs.append((run_agentrl({**spec, "seed": seed}, folder),
                         run_trl({**spec, "seed": seed}, folder, python)))
    print(f"load after: {os.getloadavg()[0]:.2f}")
    model = "quickstart warm start" if args.shape == "small" else "random 8 layers, hidden 512"
    print(f"{args.env}, {prompts} prompts x {samples} samples, {steps} steps, 40 new tokens "
          f"per turn, {model}; agentrl micro-batches of {args.microbatch_tokens} tokens"
          + "".join(f", {setting}" for setting in args.set)
          + f"; precision {args.precision}")
    ratios = []
    for seed, (ours, theirs) in enumerate(runs):
        ours_rate = 60 * ours["steps"] / ours["step_s"]
        theirs_rate = 60 * theirs["steps"] / theirs["train_s"]
        ratios.append(ours_rate / theirs_rate)
        print(f" seed {seed}\n  agentrl: {ours_rate:.2f} steps/min (generate "
              f"{ours['generate_s']:.1f} s + train {ours['train_s']:.1f} s of "
              f"{ours['step_s']:.1f} s; process {ours['wall_s']:.1f} s), peak RSS "
              f"{ours['peak_rss_mb']:.0f} MB, mean reward {ours['reward']:.3f}; "
              f"{ours['precision']}")
        print(f"  TRL:     {theirs_rate:.2f} steps/min (trainer.train() "
              f"{theirs['train_s']:.1f} s: generate and score {theirs['generate_s']:.1f} s + "
              f"the rest {theirs['train_s'] - theirs['generate_s']:.1f} s), peak RSS "
              f"{theirs['peak_rss_mb']:.0f} MB, mean reward {theirs['reward']:.3f}; "
              f"{trl_precision(theirs['precision'])}")
        print(f"  agentrl / TRL steps per minute: {ratios[-1]:.2f}x")
    if len(runs) > 1:
        rewards = [[r["reward"] for r in pair] for pair in runs]
        centre, low, high = ratio_interval(ratios)
        print(f" over {len(runs)} seeds: agentrl / TRL steps per minute median "
              f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}x), geometric mean "
              f"{centre:.2f}x (95% interval {low:.2f} to {high:.2f}x); mean reward "
              f"agentrl {statistics.mean(r[0] for r in rewards):.3f} "
              f"(sd {statistics.stdev(r[0] for r in rewards):.3f}), TRL "
              f"{statistics.mean(r[1] for r in rewards):.3f} "
              f"(sd {statistics.stdev(r[1] for r in rewards):.3f})")


if __name__ == "__main__":
    main()

"""DocQA with and without subagents: the same warm start trained side by side.

    python -m bench.subagents [--warm-start DIR] [--steps N] [--eval-every K]
                              [--seeds S ...] [--set K=V] [--out DIR] [--curve PNG]

DocQA (``agentrl/DocQA-v0``) asks for a person's code, written on one page of two
documents of two pages (~150 tokens a document): a reader's task (~100 tokens) and a whole
document do not fit the 240-token context window, its task and one page do. With subagents
(``configs/docqa.toml``) the main thread delegates each document to a reader with a
context of its own; without (``environments.0.kwargs.delegate = false``) it pages through
the documents itself, in the same context window and with the same total budget: every
thread of a tree has its own turns, generated tokens and compactions, so the control's
one thread gets those of the main thread and ``rollout.max_subagents_per_rollout``
readers together (:func:`variant_overrides`; 15 turns, 680 tokens and 20 compactions under
``configs/docqa.toml``). Steps:

1. the warm start, unless ``--warm-start DIR`` names one (``assets/docqa-weak-sft`` is the
   shipped one): ``agentrl sft configs/docqa_warmstart.toml`` three times, copy
   pretraining of a new tiny model, demonstrations of both variants, then a weaker
   demonstrator's, which searches one document on most tasks (the recipe in
   ``configs/docqa.toml``'s header);
2. per seed (``--seeds``), ``agentrl train configs/docqa.toml`` from it, validating on 64
   held-out tasks every ``--eval-every`` steps (greedy), then the same run without
   subagents (the same rollouts, the same total budget);
3. the held-out accuracy of every run per validation, the gain of each over its start,
   the wall time of each run, the machine's load (``os.getloadavg``) before and after;
   per variant the gains of the seeds, their mean and range; and the curve (``--curve``,
   default ``DIR/curve.png``). Results: ``docs/subagents.md``.

Every torch op runs single-threaded (on a small shared machine threads only fight).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.observe.writers import read_metrics

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs/docqa.toml"
COPY_BASE = ["--base", "new", "--chat-template", "compact", "--copy-steps", "2500",
             "--num-steps", "0", "--num-demonstrations", "40"]
"""The warm start's first command: a new tiny model, its tokenizer, copy pretraining."""
WARM_START = ["--num-steps", "160", "--num-demonstrations", "600", "--lr", "2e-3",
              "--lr-schedule", "cosine", "--warmup-steps", "20", "--rows-per-step", "32"]
"""Its second: the demonstrations, from the first's model (configs/docqa_warmstart.toml):
``assets/docqa-sft``, which delegates every document (0.797 held-out)."""
WEAKER = ["--num-steps", "40", "--num-demonstrations", "600", "--lr", "1e-3",
          "--lr-schedule", "cosine", "--warmup-steps", "5", "--rows-per-step", "32",
          "--set", "environments.0.kwargs={demo_search_share=0.25}"]
"""Its third, from the second's model: a demonstrator that searches every document on a
quarter of the tasks and document 0 only on the others (``DocQAEnv.demo_search_share``;
only its correct episodes are trained on), so the warm start searches one document and
RL has the delegation to learn: ``assets/docqa-weak-sft``."""
VARIANTS = ("subagents", "alone")
"""The runs of each seed: configs/docqa.toml as it is, and the control
(:func:`variant_overrides`)."""


def variant_overrides(name: str, extra: tuple[str, ...] = ()) -> list[str]:
    """A variant's overrides of configs/docqa.toml, after ``extra`` (the environment keeps
    its name, docqa). The control reads the pages itself in the same context window, its
    one thread given what the tree's threads may use together: the turns, generated
    tokens and compactions of the main thread and of ``rollout.max_subagents_per_rollout``
    readers (a reader has ``rollout.max_turns`` turns, ``rollout.max_subagent_tokens``
    tokens and ``compaction.max_compactions`` compactions of its own); the environment's
    own turn limit (``AgentEnv.max_turns``) is raised to match. Each is one key of
    ``kwargs``, so that a ``--set environments.0.kwargs.KEY=V`` is kept."""
    if name == "subagents":
        return []
    config = load_config(CONFIG, extra)
    rollout, readers = config.rollout, config.rollout.max_subagents_per_rollout
    turns = rollout.max_turns * (1 + readers)
    tokens = rollout.max_rollout_tokens + readers * rollout.max_subagent_tokens
    return ["environments.0.kwargs.delegate=false", f"environments.0.kwargs.max_turns={turns}",
            f"rollout.max_turns={turns}", f"rollout.max_rollout_tokens={tokens}",
            f"compaction.max_compactions={config.compaction.max_compactions * (1 + readers)}"]


def load() -> str:
    """The 1, 5 and 15 minute load averages, as text."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def warm_start(out: Path) -> Path:
    """Run ``agentrl sft`` three times (copy pretraining, both variants' demonstrations,
    the weaker demonstrator's); the model folder."""
    base, folder, weaker = out / "copy", out / "sft", out / "weak-sft"
    config = str(ROOT / "configs/docqa_warmstart.toml")
    start = time.perf_counter()
    assert main(["sft", config, "--out", str(base), *COPY_BASE]) == 0
    assert main(["sft", config, "--base", str(base), "--out", str(folder), *WARM_START]) == 0
    assert main(["sft", config, "--base", str(folder), "--out", str(weaker), *WEAKER]) == 0
    print(f"warm start: {time.perf_counter() - start:.0f} s (load {load()})", flush=True)
    return weaker


def train(name: str, model: Path, out: Path, steps: int, eval_every: int, seed: int = 0,
          extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One training run (``extra``: more ``--set`` overrides); its validations and wall
    time."""
    run_dir = out / f"{name}-seed{seed}"
    overrides = [f'model.path="{model}"', f"train.num_steps={steps}",
                 f"train.eval_every={eval_every}", f"train.seed={seed}", *extra,
                 *variant_overrides(name, extra)]
    before = load()
    start = time.perf_counter()
    argv = ["train", str(CONFIG), "--out", str(run_dir)]
    assert main(argv + [a for o in overrides for a in ("--set", o)]) == 0
    wall = time.perf_counter() - start
    metrics = read_metrics(run_dir)
    evals = [(m["step"], m["eval/docqa/accuracy"]) for m in metrics
             if "eval/docqa/accuracy" in m]
    trained = [m for m in metrics if "num_rollouts" in m]
    return {"name": name, "seed": seed, "wall_s": wall, "evals": evals, "load": (before, load()),
            "active_s": trained[-1]["cumulative/active_s"],
            "tokens": trained[-1]["cumulative/tokens"],
            "share": sum(m.get("subagents/generated_token_share", 0.0) for m in trained)
            / len(trained)}


def report(runs: list[dict[str, Any]]) -> None:
    """Accuracy per validation, gains, times and loads, one block per run."""
    for run in runs:
        steps = " ".join(f"{s:>5}" for s, _ in run["evals"])
        values = " ".join(f"{a:5.3f}" for _, a in run["evals"])
        gain = run["evals"][-1][1] - run["evals"][0][1]
        print(f"\n{run['name']} (seed {run['seed']}): held-out accuracy (greedy, 64 tasks)\n"
              f"  step     {steps}\n"
              f"  accuracy {values}\n  gain {gain:+.3f}; wall {run['wall_s']:.0f} s "
              f"(active {run['active_s']:.0f} s); {run['tokens']} generated tokens, "
              f"{run['share']:.0%} of them by subagents; load before {run['load'][0]}, "
              f"after {run['load'][1]}")


def summary(runs: list[dict[str, Any]]) -> None:
    """Per variant: the gain of each seed, their mean and range, the final accuracy."""
    print()
    for name in VARIANTS:
        mine = [r for r in runs if r["name"] == name]
        if not mine:
            continue
        gains = [r["evals"][-1][1] - r["evals"][0][1] for r in mine]
        finals = [r["evals"][-1][1] for r in mine]
        walls = [r["wall_s"] for r in mine]
        print(f"{name}: gain per seed {' '.join(f'{g:+.3f}' for g in gains)}; mean "
              f"{sum(gains) / len(gains):+.3f} (range {min(gains):+.3f} to {max(gains):+.3f});"
              f" final accuracy mean {sum(finals) / len(finals):.3f}; wall "
              f"{min(walls):.0f}-{max(walls):.0f} s")


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Held-out accuracy against steps, every run (one colour per variant)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    labels = {"subagents": "with subagents (delegate each document)",
              "alone": "without (the main thread reads the pages, same total budget)"}
    colours = {"subagents": "tab:blue", "alone": "tab:orange"}
    for run in runs:
        steps, accuracy = zip(*run["evals"], strict=True)
        first = run is next(r for r in runs if r["name"] == run["name"])
        ax.plot(steps, accuracy, marker="o", color=colours[run["name"]], alpha=0.8,
                label=f"{labels[run['name']]}, seeds" if first else None)
    ax.set_xlabel("training step (32 rollouts each)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title("DocQA: a reader's task and a whole document\n"
                 "(~100 + ~150 tokens) do not fit the 240-token context", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\ncurve: {path}")


def main_bench() -> None:
    """Parse the arguments, run the warm start and both trainings, report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-start", type=Path, default=None,
                        help="a model folder made by the warm start (default: make one)")
    parser.add_argument("--steps", type=int, default=16, help="training steps per run")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/agentrl-bench-subagents"))
    parser.add_argument("--curve", type=Path, default=None)
    parser.add_argument("--only", choices=sorted(VARIANTS), default=None,
                        help="run one variant only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="train.seed of each pair of runs")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a setting of configs/docqa.toml in every run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"load at start: {load()} ({os.cpu_count()} cores)", flush=True)
    model = args.warm_start or warm_start(args.out)
    names = [args.only] if args.only else list(VARIANTS)
    runs = [train(name, model, args.out, args.steps, args.eval_every, seed, tuple(args.set))
            for seed in args.seeds for name in names]
    report(runs)
    summary(runs)
    plot(runs, args.curve or args.out / "curve.png")


if __name__ == "__main__":
    main_bench()

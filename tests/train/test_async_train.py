"""`agentrl train` with asynchronous collection (rollout.max_staleness >= 1): versions on
every trained token within the bound, the off-policy corrections wired in, and a real
SIGKILL mid-run followed by `--resume` that neither loses nor repeats a trained rollout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.cli import main
from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.train.checkpoint import latest_checkpoint, read_state
from tests.train.test_train_e2e import CONFIG

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def _config(tmp_path: Path, model_dir: Path, steps: int, checkpoint_every: int = 2,
            eval_every: int = 0) -> Path:
    path = tmp_path / "async.toml"
    text = CONFIG.format(model=model_dir, budget=4096, steps=steps, eval_every=eval_every)
    path.write_text(text.replace("checkpoint_every = 2",
                                 f"checkpoint_every = {checkpoint_every}"))
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("collector", ["thread", "process"])
def test_async_run_keeps_every_token_within_the_bound(tmp_path, model_dir, collector) -> None:
    out = tmp_path / "run"
    overrides = ["rollout.max_staleness=1", "rollout.inflight_updates=true",
                 f'rollout.collector="{collector}"',
                 'loss.objective="decoupled"', "loss.negative_advantage_veto=4.0",
                 "loss.relaxed_clip_eps_high=0.5", 'optim.lr_scaling="sqrt"',
                 "optim.lr_reference_batch=8"]
    # validations at steps 0, 2 and 4 share the engine with the generation running ahead
    argv = ["train", str(_config(tmp_path, model_dir, steps=4, eval_every=2)), "--out",
            str(out)]
    assert main(argv + [a for o in overrides for a in ("--set", o)]) == 0
    metrics = _lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [0, 2, 4]
    metrics = [m for m in metrics if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m["staleness/max"] <= 1  # none dropped: it raises
        assert m["env/ShortAnswerEnv/staleness/max"] <= 1
        assert "loss/veto_frac" in m and "time/engine_idle" in m
        assert "loss/mismatch_scored" in m  # the decoupled objective's proximal pass
    assert metrics[0]["staleness/mean"] == 0.0  # the first collection: nothing to be behind
    assert [m["cumulative/rollouts"] for m in metrics] == [4, 8, 12, 16]
    # square-root lr scaling: 1e-2 × sqrt(2 rollouts per update / 8), reached after warm-up
    assert metrics[0]["optim/lr"] == pytest.approx(5e-3)
    trained = _lines(out / "trained_rollouts.jsonl")
    assert [t["step"] for t in trained] == [1, 2, 3, 4]
    ids = [r[0] for t in trained for r in t["rollouts"]]
    assert len(ids) == len(set(ids)) == 16
    for t in trained:
        for rollout_id, _env, _seed, runs in t["rollouts"]:
            # carry-over (on by default): a group drawn for collection c is trained by
            # step c - 1 (done early) up to step c + k (carried over)
            assert t["step"] - 1 <= int(rollout_id.split("-")[0][1:]) <= t["step"] + 1
            assert runs and all(0 <= t["step"] - 1 - version <= 1 for _, version in runs)
    start, end = load_pretrained(model_dir).state_dict(), load_pretrained(
        out / "checkpoints" / "step_4").state_dict()
    assert any(not torch.equal(start[n], end[n]) for n in start)


def _spawn_train(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    code = "import sys; from agentrl.cli import main; sys.exit(main(sys.argv[1:]))"
    # the marker finds every process of this run, a collector process included
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "AGENTRL_TEST_RUN": str(out)}
    return subprocess.Popen(
        [sys.executable, "-c", code, "train", str(config), "--out", str(out),
         "--set", "rollout.max_staleness=1", *extra],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _steps_logged(out: Path) -> list[int]:
    path = out / "trained_rollouts.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except json.JSONDecodeError:  # a line being written
            break
    return steps


def _processes_of(out: Path) -> list[int]:
    """Pids of live processes started with ``_spawn_train(..., out)`` (zombies excluded)."""
    marker = f"AGENTRL_TEST_RUN={out}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            alive = (proc / "stat").read_text().split(") ")[-1][0] != "Z"
            if alive and marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except (OSError, ValueError):  # not a process, or it ended meanwhile
            continue
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["thread", "process"])
def test_sigkill_then_resume_trains_every_rollout_exactly_once(tmp_path, model_dir,
                                                               collector) -> None:
    config, out = _config(tmp_path, model_dir, steps=40), tmp_path / "killed"
    chosen = ("--set", f'rollout.collector="{collector}"')
    proc = _spawn_train(config, out, *chosen)
    # kill once a step past the newest checkpoint was trained (odd steps are never
    # checkpointed with checkpoint_every = 2), while the collector is generating ahead
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        steps = _steps_logged(out)
        if steps and steps[-1] >= 3 and steps[-1] % 2 == 1:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    if collector == "process":
        # the trainer, its collector process (and multiprocessing's resource tracker)
        assert len(_processes_of(out)) >= 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60  # an orphaned collector sees its pipe close and exits
    while _processes_of(out) and time.time() < deadline:
        time.sleep(0.1)
    assert not _processes_of(out)
    killed = {t["step"]: t["rollouts"] for t in _lines(out / "trained_rollouts.jsonl")}
    checkpoint = read_state(latest_checkpoint(out)).step
    lost = [s for s in killed if s > checkpoint]  # trained, but not in any checkpoint
    assert lost

    final = checkpoint + 3
    resumed = _spawn_train(config, out, *chosen, "--resume", "--set",
                           f"train.num_steps={final}")
    assert resumed.wait(timeout=240) == 0, resumed.stderr.read().decode()[-2000:]
    trained = _lines(out / "trained_rollouts.jsonl")
    # every step exactly once, in order; no rollout id twice; four rollouts per step
    assert [t["step"] for t in trained] == list(range(1, final + 1))
    ids = [r[0] for t in trained for r in t["rollouts"]]
    assert len(ids) == len(set(ids)) == 4 * final
    # the rollouts the kill lost were regenerated: same rollout ids, same tasks (with
    # carry-over a group may land one step earlier or later than before; the resumed run
    # draws no collection past its last step)
    before = {(r[0], r[1], r[2]) for step in lost for r in killed[step]
              if int(r[0].split("-")[0][1:]) <= final}
    after = {(r[0], r[1], r[2]) for t in trained for r in t["rollouts"]}
    assert before <= after
    metrics = _lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, final + 1))
    assert [m["cumulative/rollouts"] for m in metrics] == [4 * s for s in range(1, final + 1)]
    assert read_state(latest_checkpoint(out)).cumulative_rollouts == 4 * final

"""Training survives broken environments: no NaN reaches the weights, a mostly broken
environment stops the run with a summary, a non-finite update is skipped by name."""

from __future__ import annotations

import json
import math
from collections import Counter

import msgspec
import numpy as np
import pytest
import torch

from agentrl.cli import main
from agentrl.envs import AgentEnv, Grade, Task
from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.rollout.health import InvalidRateMonitor, RunStopped, invalid_figures
from agentrl.train.update import UpdateStats, step_if_finite
from agentrl.types import Message

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = {group_size}
global_batch_size = {global_batch}
[rollout]
max_new_tokens = 6
max_turns = 1
[optim]
lr = 1e-2
[train]
num_steps = {steps}
checkpoint_every = 1
max_invalid_fraction = {fraction}
[log]
live = false
[[environments]]
id = "tests.train.test_robust_training:ShortEnv"
name = "short"
[[environments]]
id = "tests.train.test_robust_training:{broken}"
name = "broken"
"""


class ShortEnv(AgentEnv):
    """Reward 1 for a reply under 12 characters: mixed rewards from a random model."""

    max_turns = 1

    def sample_task(self, rng: np.random.Generator) -> Task:
        n = int(rng.integers(1000))
        return Task([Message("user", f"Say {n}.")], answer=n, key=str(n))

    def grade(self, answer: str) -> Grade:
        return Grade(float(len(answer) < 12))


class InfRewardEnv(ShortEnv):
    """A reward of inf for replies of even length: once silently NaN'd every weight."""

    def grade(self, answer: str) -> Grade:
        return Grade(math.inf if len(answer) % 2 == 0 else float(len(answer) < 12))


class RaisingEnv(ShortEnv):
    """Every step raises."""

    def step(self, action: str):
        raise RuntimeError("the grader crashed")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def run_training(tmp_path, model_dir, broken: str, steps: int = 2, group_size: int = 4,
                 fraction: float = 1.0, overrides: tuple = ()) -> tuple[int, object]:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(model=model_dir, broken=broken, steps=steps,
                                    group_size=group_size, global_batch=2 * group_size,
                                    fraction=fraction))
    out = tmp_path / "run"
    sets = [arg for override in overrides for arg in ("--set", override)]
    return main(["train", str(config), "--out", str(out), *sets]), out


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_an_infinite_reward_never_reaches_the_weights(tmp_path, model_dir):
    status, out = run_training(tmp_path, model_dir, "InfRewardEnv")
    assert status == 0
    weights = load_pretrained(out / "checkpoints" / "step_2").state_dict()
    assert all(torch.isfinite(t).all() for t in weights.values())
    initial = load_pretrained(model_dir).state_dict()
    assert any(not torch.equal(initial[n], t) for n, t in weights.items())  # it trained
    records = metrics(out)
    assert sum(r.get("env/broken/invalid/bad_reward", 0) for r in records) > 0
    assert all(math.isfinite(r["reward/mean"]) for r in records)


def test_a_mostly_broken_environment_stops_the_run_with_a_summary(tmp_path, model_dir,
                                                                  capsys):
    status, out = run_training(tmp_path, model_dir, "RaisingEnv", steps=4, group_size=8,
                               fraction=0.5)
    assert status == 3
    err = capsys.readouterr().err
    assert "environment 'broken' is mostly broken: 16 of its 16 rollouts in steps 1-2" in err
    assert "Reasons: step_raised 16" in err
    assert "RuntimeError: the grader crashed" in err and "Traceback" in err
    records = metrics(out)
    assert [r["step"] for r in records] == [1]  # step 2 was not trained on
    assert records[0]["invalid/step_raised"] == 8


def test_every_rank_stops_together(tmp_path, model_dir, capfd):
    status, out = run_training(tmp_path, model_dir, "RaisingEnv", steps=4, group_size=8,
                               fraction=0.5, overrides=("train.num_ranks=2",))
    assert status == 3
    captured = capfd.readouterr()
    assert captured.err.count("is mostly broken: 16 of its 16 rollouts") == 1
    assert captured.out.count("per collection:") == 1  # the launcher's plan, not again
    assert captured.out.count("context budget (first prompt") == 1
    assert [r["step"] for r in metrics(out)] == [1]


def overflowing_gradient_checkpoint(path) -> object:
    """A checkpoint whose forward (sampling, loss) is the plain one's but whose gradient
    overflows: the final norm's weight times 2^100 and the head's times 2^-100 (powers of
    two: the logits are unchanged bit for bit), so the head's gradient, the final hidden
    states times the logit gradients, reaches ~1e30 and its norm inf."""
    from safetensors.torch import load_file, save_file

    path = build_tiny_checkpoint(path, hidden_size=32, num_layers=1, num_heads=2,
                                 num_kv_heads=1, vocab_size=300, tie_word_embeddings=False)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * 2.0**100
    weights["lm_head.weight"] = weights["lm_head.weight"] * 2.0**-100
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_a_non_finite_update_is_skipped_named_and_counted(tmp_path):
    """A real gradient that overflows (nothing patched): the update is skipped, named and
    counted, and no weight moves."""
    model_dir = overflowing_gradient_checkpoint(tmp_path / "m")
    with pytest.warns(UserWarning, match=r"step 1, update 1 of 1: non-finite update "
                                         r"\(loss [-0-9.e]+, gradient norm inf\)"):
        status, out = run_training(tmp_path, model_dir, "ShortEnv", steps=1)
    assert status == 0
    assert metrics(out)[0]["optim/skipped_updates"] == 1
    # the one built-in replica's figures: every rollout's one turn went to it
    assert metrics(out)[0]["replica/0/requests"] == metrics(out)[0]["num_rollouts"] == 8
    weights = load_pretrained(out / "checkpoints" / "step_1").state_dict()
    initial = load_pretrained(model_dir).state_dict()
    assert all(torch.equal(initial[n], t) for n, t in weights.items())


def _stats(loss: float) -> UpdateStats:
    return UpdateStats(loss=loss, policy_loss=loss, kl_loss=0.0, clip_frac_low=0.0,
                       clip_frac_high=0.0, approx_kl=0.0, entropy=0.0, mismatch=0.0,
                       tis_weight=1.0, num_tokens=3, num_micro_batches=1)


@pytest.mark.parametrize("loss, norm", [(math.nan, 1.0), (1.0, math.inf), (1.0, math.nan)])
def test_step_if_finite_leaves_weights_and_moments_alone(loss, norm):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    for p in model.parameters():
        p.grad = torch.full_like(p, math.nan)
    why = step_if_finite(optimizer, _stats(loss), norm)
    assert why is not None and "non-finite update" in why
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())
    assert not optimizer.state  # no moments were touched
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert step_if_finite(optimizer, _stats(0.5), 2.0) is None
    assert not torch.equal(before["weight"], model.weight)


def test_stop_rule_waits_for_enough_rollouts_and_forgets_old_steps():
    monitor = InvalidRateMonitor(0.5, min_rollouts=16, window_steps=5)
    # a tiny batch with one unlucky step (3 of 4 invalid) does not stop the run
    monitor.observe(1, {"e": 4}, {"e": {"step_timeout": 3}}, {})
    for step in range(2, 6):
        monitor.observe(step, {"e": 4}, {}, {})
    # a broken environment: 4 of 4 invalid per step stops once more than half of its
    # newest 16 rollouts are invalid; step 1's timeouts have left the window by then
    monitor.observe(6, {"e": 4}, {"e": {"bad_reward": 4}}, {"e/bad_reward": "the first"})
    monitor.observe(7, {"e": 4}, {"e": {"bad_reward": 4}}, {})  # 8 of 16: not more than half
    with pytest.raises(RunStopped, match=r"(?s)12 of its 16 rollouts in steps 5-8 .*"
                                         r"bad_reward 12\..*the first"):
        monitor.observe(8, {"e": 4}, {"e": {"bad_reward": 4}}, {})


def test_stop_rule_judges_a_large_batch_on_one_step_and_never_at_one():
    monitor = InvalidRateMonitor(0.5)
    monitor.observe(1, {"e": 64, "f": 64}, {"e": {"x": 32}}, {})  # exactly half: goes on
    with pytest.raises(RunStopped, match="environment 'e'.* 33 of its 64 rollouts in step 2"):
        monitor.observe(2, {"e": 64}, {"e": {"x": 33}}, {})
    never = InvalidRateMonitor(1.0)
    never.observe(1, {"e": 64}, {"e": {"x": 64}}, {})


def test_invalid_figures_per_environment_and_overall():
    figures = invalid_figures({"a": {"bad_reward": 2, "step_timeout": 1},
                               "b": {"bad_reward": 3}})
    assert figures == {"invalid/bad_reward": 5, "invalid/step_timeout": 1,
                       "env/a/invalid/bad_reward": 2, "env/a/invalid/step_timeout": 1,
                       "env/b/invalid/bad_reward": 3}


def test_collection_counts_cross_ranks():
    from agentrl.rollout.runner import CollectionResult

    result = CollectionResult(groups=[], num_played={"a": 3}, invalid={"a": {"bad_info": 1}},
                              first_errors={"a/bad_info": "text"})
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=CollectionResult)
    assert decoded.invalid == {"a": {"bad_info": 1}} and decoded.num_played == {"a": 3}
    assert Counter(decoded.first_errors) == Counter(result.first_errors)

"""End to end: a few steps of `agentrl train` on a tiny model, its metrics, checkpoints,
resume (bit-exact 2 + 2 = 4 steps with train.deterministic; otherwise no rollout lost or
trained twice) and micro-batch invariance of the weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from agentrl.cli import main
from agentrl.envs import AgentEnv, Grade, Task
from agentrl.model import build_tiny_checkpoint, load_pretrained
from agentrl.model.checkpoint import load_pretrained as load_again  # same loader, by name
from agentrl.types import Message

pytestmark = pytest.mark.slow  # real training runs end to end, resumes included

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 2
global_batch_size = 2
max_tokens_per_microbatch = {budget}
[rollout]
max_new_tokens = 10
max_turns = 2
max_concurrent_rollouts = 4     # every rollout of a collection in flight at once
[optim]
lr = 1e-2
warmup_steps = 2
[compaction]
strategy = "drop_oldest"
max_context_tokens = 1024
[train]
num_steps = {steps}
eval_every = {eval_every}
eval_tasks_per_env = 1
checkpoint_every = 2
seed = 3
[log]
live = false
[[environments]]
id = "agentrl/Calculator-v0"
weight = 1.0
kwargs = {{max_number = 9}}
[[environments]]
id = "tests.train.test_train_e2e:ShortAnswerEnv"
weight = 1.0
"""


class ShortAnswerEnv(AgentEnv):
    """Single turn; reward 1 for a reply under 12 characters. Even a random model gets
    mixed rewards here, so every group carries signal and the weights must move."""

    max_turns = 1

    def sample_task(self, rng: np.random.Generator) -> Task:
        """A prompt with a random number, so tasks differ by seed."""
        number = int(rng.integers(1000))
        return Task([Message("user", f"Say {number}.")], answer=number, key=str(number))

    def grade(self, answer: str) -> Grade:
        """Short replies win."""
        return Grade(float(len(answer) < 12), {"correct": float(len(answer) < 12)})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300)


def _train(tmp_path, model_dir, name, steps=4, budget=4096, eval_every=0, resume=False,
           overrides=()):
    config = tmp_path / f"{name}.toml"
    config.write_text(CONFIG.format(model=model_dir, budget=budget, steps=steps,
                                    eval_every=eval_every))
    out = tmp_path / name
    argv = ["train", str(config), "--out", str(out)] + (["--resume"] if resume else [])
    argv += [arg for o in overrides for arg in ("--set", o)]
    assert main(argv) == 0
    return out


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(path):
    return load_pretrained(path).state_dict()


def _without_times(record):
    """A metrics record without its wall-clock figures (seconds, rates per second, and
    the costs priced from seconds)."""
    return {k: v for k, v in record.items() if not k.startswith("time/") and
            not k.endswith(("_s", "tokens_per_s", "_seconds", "cost/step", "per_reward_point"))
            and k != "cumulative/cost"}


DETERMINISTIC = ["train.deterministic=true"]
MIXED = ["train.seed=4"]
"""A seed whose first steps draw mixed rewards, so the weights move (seed 3's first two
steps draw reward 0 in every group: every advantage 0, no weight changes)."""


def _moved(model_dir, weights) -> bool:
    """Whether ``weights`` differ from the initial model's anywhere."""
    start = _weights(model_dir)
    return any(not torch.equal(start[n], weights[n]) for n in weights)


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, model_dir):
    return _train(tmp_path_factory.mktemp("full"), model_dir, "full", eval_every=2,
                  overrides=DETERMINISTIC)


def test_metrics_and_checkpoint_format(four_steps) -> None:
    records = _metrics(four_steps)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # step 0: validation before training
    step = records[1]
    for key in ("num_groups", "num_rollouts", "num_rows", "num_sampled_tokens",
                "num_trainable_tokens", "num_uniform_groups", "reward/mean",
                "response_length/mean", "truncation_rate", "loss/clip_frac", "loss/kl",
                "loss/entropy", "optim/grad_norm", "loss/mismatch", "optim/lr",
                "cumulative/rollouts", "cumulative/tokens", "time/generate", "time/train",
                "time/sync", "time/other"):
        assert key in step, key
    for env in ("Calculator-v0", "ShortAnswerEnv"):
        assert f"env/{env}/reward/mean" in step and f"env/{env}/num_rollouts" in step
        assert f"eval/{env}/accuracy" in records[2]
    assert step["num_rollouts"] == 4 and step["num_groups"] == 2
    assert [r["cumulative/rollouts"] for r in records] == [0, 4, 8, 12, 16]
    assert records[-1]["cumulative/updates"] == 8  # 2 updates of 2 rollouts per step
    # warm-up over updates: lr after the first step's two updates is the peak
    assert records[1]["optim/lr"] == pytest.approx(1e-2)
    assert "loss/mismatch_scored" in step  # two updates per step: scoring pass ran

    transformers = pytest.importorskip("transformers")
    ckpt = four_steps / "checkpoints" / "step_4"
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32)
    ids = torch.arange(9)[None]
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, load_again(ckpt)(ids, None, None),
                                   atol=1e-4, rtol=1e-4)
    assert sorted(p.name for p in (four_steps / "checkpoints").iterdir()) == ["step_2",
                                                                              "step_4"]


def test_deterministic_resume_2_plus_2_equals_4(tmp_path, model_dir, four_steps) -> None:
    # 4 rollouts in flight at once, so decode batches mix rollouts as timing decides;
    # train.deterministic makes every bit independent of that
    out = _train(tmp_path, model_dir, "split", steps=2, eval_every=2, overrides=DETERMINISTIC)
    (tmp_path / "split.toml").write_text(
        (tmp_path / "split.toml").read_text().replace("num_steps = 2", "num_steps = 4"))
    assert main(["train", str(tmp_path / "split.toml"), "--out", str(out), "--resume",
                 "--set", DETERMINISTIC[0]]) == 0
    full, split = _weights(four_steps / "checkpoints" / "step_4"), _weights(
        out / "checkpoints" / "step_4")
    for name, tensor in full.items():
        assert torch.equal(tensor, split[name]), name
    assert [_without_times(r) for r in _metrics(four_steps)] == [
        _without_times(r) for r in _metrics(out)]
    # the run really trained: weights moved away from the start
    start = _weights(model_dir)
    assert any(not torch.equal(start[n], full[n]) for n in full)


def test_default_resume_loses_no_rollout_and_trains_none_twice(tmp_path, model_dir,
                                                               capsys) -> None:
    # a run killed while writing step 3's checkpoint: step 3's metrics line is written,
    # its checkpoint only a .tmp folder. The resume continues from step 2.
    out = _train(tmp_path, model_dir, "killed", steps=3)
    before = _metrics(out)
    root = out / "checkpoints"
    shutil.rmtree(root / "step_3")
    (root / ".tmp-step_3-k1ll3d").mkdir()
    (root / ".tmp-step_3-k1ll3d" / "model.safetensors").write_bytes(b"half written")
    config = tmp_path / "killed.toml"
    config.write_text(config.read_text().replace("num_steps = 3", "num_steps = 4"))
    capsys.readouterr()
    assert main(["train", str(config), "--out", str(out), "--resume"]) == 0
    said = capsys.readouterr().out
    assert f"removed {root / '.tmp-step_3-k1ll3d'}: a partial checkpoint" in said
    assert "resuming" in said and "at step 2" in said
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_4"]
    after = _metrics(out)
    # every step once, each trained on its 4 rollouts once: the killed step 3 is redone
    # from the step-2 weights, its old line replaced, never counted twice
    assert [r["step"] for r in after] == [1, 2, 3, 4]
    assert after[:2] == before[:2]
    assert [r["num_rollouts"] for r in after] == [4, 4, 4, 4]
    assert [r["cumulative/rollouts"] for r in after] == [4, 8, 12, 16]
    assert [r["cumulative/updates"] for r in after] == [2, 4, 6, 8]
    tokens = [r["num_sampled_tokens"] for r in after]
    assert [r["cumulative/tokens"] for r in after] == list(np.cumsum(tokens))
    assert after[2]["cumulative/active_s"] > after[1]["cumulative/active_s"]


def test_the_resumed_run_starts_from_the_checkpoint_weights(tmp_path, model_dir) -> None:
    from agentrl.config import load_config
    from agentrl.train.run import build_run

    out = _train(tmp_path, model_dir, "base", steps=2)
    resumed = build_run(load_config(tmp_path / "base.toml"), out, resume=True)
    resumed.writers.close()
    saved = _weights(out / "checkpoints" / "step_2")
    assert resumed.state.step == 2 and resumed.state.cumulative_rollouts == 8
    from agentrl.parallel.fsdp import full_state_dict

    for name, tensor in full_state_dict(resumed.model).items():
        assert torch.equal(tensor, saved[name]), name


def test_micro_batch_budget_does_not_change_the_update(tmp_path, model_dir) -> None:
    # a budget holds the longest possible row (plan refuses less): 780 + 10 new tokens;
    # every row whole (no shared prompts), so the small budget really splits the batch
    context = ["compaction.max_context_tokens=780", "batch.share_prefixes=false", *MIXED]
    small = _train(tmp_path, model_dir, "small", steps=1, budget=800, overrides=context)
    large = _train(tmp_path, model_dir, "large", steps=1, budget=8192, overrides=context)
    assert _metrics(small)[0]["num_micro_batches"] > _metrics(large)[0]["num_micro_batches"]
    a, b = _weights(small / "checkpoints" / "step_1"), _weights(large / "checkpoints" /
                                                               "step_1")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5)
    assert _moved(model_dir, b)


def test_shared_prompts_do_not_change_the_update(tmp_path, model_dir) -> None:
    # each group's prompt held once per micro-batch (the CPU default) or in every row:
    # the same update; AdamW's first step divides by sqrt(v), so its tiniest gradient
    # entries carry the reordered float sums a little further than the gradient itself
    shared = _train(tmp_path, model_dir, "shared", steps=1, overrides=MIXED)
    whole = _train(tmp_path, model_dir, "whole", steps=1,
                   overrides=["batch.share_prefixes=false", *MIXED])
    a, b = _weights(shared / "checkpoints" / "step_1"), _weights(whole / "checkpoints" /
                                                                "step_1")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert any(not torch.equal(a[name], b[name]) for name in a)  # the layouts did differ
    assert _metrics(shared)[0]["reward/mean"] == _metrics(whole)[0]["reward/mean"]
    assert _moved(model_dir, a)


def test_padding_micro_batches_to_a_token_multiple_does_not_change_the_update(
        tmp_path, model_dir, capsys, monkeypatch) -> None:
    # batch.token_multiple pads each micro-batch with masked tokens (on by default on a
    # CPU in bf16 only): the same update as without it
    from agentrl.train import trainer

    lengths = []

    def collate(*args, **kwargs):
        batch = real_collate(*args, **kwargs)
        lengths.append(batch.input_ids.shape[1])
        return batch

    real_collate = trainer.collate
    monkeypatch.setattr(trainer, "collate", collate)
    plain = _train(tmp_path, model_dir, "plain", steps=1, overrides=MIXED)
    assert "padded to multiples" not in capsys.readouterr().out  # float32: no padding
    unpadded = list(lengths)
    lengths.clear()
    padded = _train(tmp_path, model_dir, "padded", steps=1,
                    overrides=["batch.token_multiple=64", *MIXED])
    assert "padded to multiples of 64 tokens" in capsys.readouterr().out
    assert lengths and all(n % 64 == 0 for n in lengths)
    assert any(n % 64 for n in unpadded)  # the padding did something
    a, b = _weights(plain / "checkpoints" / "step_1"), _weights(padded / "checkpoints" /
                                                               "step_1")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    first, second = _metrics(plain)[0], _metrics(padded)[0]
    assert first["reward/mean"] == second["reward/mean"]
    assert first["loss/policy_loss"] == pytest.approx(second["loss/policy_loss"], abs=1e-6)
    assert _moved(model_dir, b)
    _train(tmp_path, model_dir, "bf16", steps=1, overrides=["model.dtype=bfloat16", *MIXED])
    assert "padded to multiples of 64 tokens" in capsys.readouterr().out  # the CPU default


def test_two_data_parallel_ranks_train_the_same_weights(tmp_path, model_dir) -> None:
    # rank 0 collects and broadcasts; each rank trains on its share of the rows; the
    # token count and gradients are summed over ranks, so the weights equal one process's
    # (a seed whose draws give mixed rewards, so the weights move: checked below)
    one = _train(tmp_path, model_dir, "one", steps=2, overrides=MIXED)
    two = _train(tmp_path, model_dir, "two", steps=2, overrides=["train.num_ranks=2", *MIXED])
    a, b = _weights(one / "checkpoints" / "step_2"), _weights(two / "checkpoints" / "step_2")
    for name in a:  # 4 AdamW updates at lr 1e-2 amplify the reordered float sums a little
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert [r["num_rollouts"] for r in _metrics(two)] == [4, 4]
    assert _metrics(two)[0]["reward/mean"] == _metrics(one)[0]["reward/mean"]
    assert _moved(model_dir, b)


def test_engine_old_logprobs_skip_the_scoring_pass(tmp_path, model_dir) -> None:
    # two updates per collection: "score" recomputes the old policy before the first
    # update; "engine" takes the engine's log-probs. The torch engine shares the trainer's
    # model, so both are the same policy and the weights agree to float rounding.
    scored = _train(tmp_path, model_dir, "scored", steps=1, overrides=MIXED)
    engine = _train(tmp_path, model_dir, "engine", steps=1,
                    overrides=['loss.old_logprobs="engine"', *MIXED])
    assert 0 < _metrics(scored)[0]["loss/mismatch_scored"] < 1e-4  # one policy, fp32 both
    assert "loss/mismatch_scored" not in _metrics(engine)[0]
    a, b = _weights(scored / "checkpoints" / "step_1"), _weights(engine / "checkpoints" /
                                                                 "step_1")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert _moved(model_dir, b)


def test_kl_to_the_initial_model_enters_the_loss(tmp_path, model_dir) -> None:
    # π_ref is the initial model: zero KL on the first update, positive once the policy
    # moved (second update of the collection); with kl_coef = 0 it stays exactly 0
    plain = _metrics(_train(tmp_path, model_dir, "plain", steps=4))
    kl_run = _train(tmp_path, model_dir, "kl", steps=4, overrides=["loss.kl_coef=0.5"])
    with_kl = _metrics(kl_run)
    assert all(r["loss/kl_loss"] == 0.0 for r in plain)
    assert any(r["loss/approx_kl"] > 0.0 for r in plain)  # the policy did move
    assert any(r["loss/kl_loss"] > 0.0 for r in with_kl)
    assert all(r["loss/kl_loss"] >= 0.0 for r in with_kl)  # k3 is never negative
    # on resume the reference is still the initial model, not the checkpoint
    from agentrl.config import load_config
    from agentrl.parallel.fsdp import full_state_dict
    from agentrl.train.run import build_run

    config = load_config(tmp_path / "kl.toml", ["loss.kl_coef=0.5"])
    resumed = build_run(config, kl_run, resume=True)
    resumed.writers.close()
    initial = _weights(model_dir)
    for name, tensor in full_state_dict(resumed.reference).items():
        assert torch.equal(tensor, initial[name]), name
    policy = full_state_dict(resumed.model)
    assert any(not torch.equal(t, initial[n]) for n, t in policy.items())


def test_a_step_leaves_no_gradients_and_one_rank_trains_an_unwrapped_model(
        tmp_path, model_dir) -> None:
    """After a step's update the gradients are freed (they would otherwise sit through
    the next collection beside the engine's KV cache), the update having moved the
    weights; one rank computing in fp32 trains the model unwrapped, not FSDP2-sharded."""
    from agentrl.config import load_config
    from agentrl.parallel.fsdp import is_sharded
    from agentrl.train.run import build_run
    from agentrl.train.trainer import train_step

    _train(tmp_path, model_dir, "base", steps=1)  # writes the config
    run = build_run(load_config(tmp_path / "base.toml", MIXED), tmp_path / "again")
    try:
        assert not is_sharded(run.model)
        before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
        metrics = train_step(run, 1)
    finally:
        run.close()
    assert metrics["optim/skipped_updates"] == 0
    assert any(not torch.equal(p, before[n]) for n, p in run.model.named_parameters())
    assert all(p.grad is None for p in run.model.parameters())

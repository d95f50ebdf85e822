"""Config loading, overrides, unknown keys, the loss mode, and the four batch knobs."""

from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import ConfigError, config_from_dict, load_config
from agentrl.config.accounting import describe_plan, plan_batches

ONE_ENV = [{"id": "agentrl/Countdown-v0"}]


def make(batch=None, **sections):
    return config_from_dict({"environments": ONE_ENV, "batch": batch or {}, **sections})


@pytest.mark.parametrize(("global_batch", "updates"), [(128, 4), (512, 1), (64, 8)])
def test_64_groups_of_8(global_batch, updates):
    config = make({"rollout_batch_size": 64, "n_samples_per_prompt": 8,
                   "global_batch_size": global_batch})
    plan = plan_batches(config)
    assert plan.num_rollouts == 512
    assert plan.num_updates == updates


def test_96_does_not_divide_512():
    with pytest.raises(ConfigError, match="global_batch_size 96 does not divide 64 groups × 8 "
                       "samples = 512 rollouts"):
        make({"rollout_batch_size": 64, "n_samples_per_prompt": 8, "global_batch_size": 96})


def test_given_updates_are_checked():
    make({"rollout_batch_size": 64, "n_samples_per_prompt": 8, "global_batch_size": 128,
          "num_steps_per_rollout": 4})
    with pytest.raises(ConfigError, match="128 × num_steps_per_rollout 2 = 256 rollouts, but a "
                       "collection has 64 groups × 8 samples = 512"):
        make({"rollout_batch_size": 64, "n_samples_per_prompt": 8, "global_batch_size": 128,
              "num_steps_per_rollout": 2})


def test_per_environment_group_sizes_count_rollouts():
    config = config_from_dict({
        "batch": {"rollout_batch_size": 4, "n_samples_per_prompt": 8, "global_batch_size": 24},
        "environments": [{"id": "a/A-v0", "weight": 1.0},
                         {"id": "b/B-v0", "weight": 1.0, "group_size": 4}],
    })
    plan = plan_batches(config)
    assert plan.num_rollouts == 2 * 8 + 2 * 4
    assert plan.num_updates == 1
    assert [(e.name, e.num_groups, e.num_rollouts) for e in plan.envs] == [
        ("A-v0", 2, 16), ("B-v0", 2, 8)]


def test_mixed_group_sizes_need_whole_group_counts():
    with pytest.raises(ConfigError, match="different group sizes .* 4 × share 0.333 = 1.33"):
        config_from_dict({
            "batch": {"rollout_batch_size": 4, "global_batch_size": 4},
            "environments": [{"id": "a/A-v0", "weight": 1.0},
                             {"id": "b/B-v0", "weight": 2.0, "group_size": 2}],
        })


@pytest.mark.parametrize("mode", ["sequence", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm", "bnpo", "grpo"])
def test_sequence_level_modes_are_refused_with_the_reason(mode):
    with pytest.raises(ConfigError, match=f'"{mode}" is a sequence-level mode.*depends on '
                       "compaction"):
        make(loss={"aggregation": mode})


def test_token_aggregation_is_accepted():
    assert make(loss={"aggregation": "token"}).loss.aggregation == "token"


def test_unknown_keys_name_the_closest_valid_one():
    with pytest.raises(ConfigError, match="unknown setting 'batch.global_bach_size'; did you "
                       "mean 'batch.global_batch_size'"):
        make({"global_bach_size": 4})
    with pytest.raises(ConfigError, match=r"environments\[0\].wieght'; did you mean "):
        config_from_dict({"environments": [{"id": "x", "wieght": 2}]})
    with pytest.raises(ConfigError, match="unknown setting 'bacth'; did you mean 'batch'"):
        config_from_dict({"environments": ONE_ENV, "bacth": {}})


def test_wrong_types_and_bad_weights():
    with pytest.raises(ConfigError, match="Expected `int`"):
        make({"global_batch_size": "many"})
    with pytest.raises(ConfigError, match=r"environments\[0\].weight = 0.0 is out of range: it "
                       "must be a finite number > 0"):
        config_from_dict({"environments": [{"id": "x", "weight": 0.0}]})
    with pytest.raises(ConfigError, match="no \\[\\[environments\\]\\]"):
        config_from_dict({"environments": []})


def test_overrides_and_the_plan_command(tmp_path: Path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('[batch]\nrollout_batch_size = 64\nn_samples_per_prompt = 8\n'
                    'global_batch_size = 512\n\n[[environments]]\nid = "agentrl/Countdown-v0"\n'
                    '\n[[environments]]\nid = "agentrl/GSM8K-v0"\nweight = 3\n')
    config = load_config(path, ["batch.global_batch_size=128", "environments.1.weight=1",
                                'model.dtype="bfloat16"'])
    assert config.batch.global_batch_size == 128
    assert config.environments[1].weight == 1
    assert config.model.dtype == "bfloat16"
    assert main(["plan", str(path), "--set", "batch.global_batch_size=128"]) == 0
    out = capsys.readouterr().out
    assert "64 groups × 8 samples = 512 rollouts" in out
    assert "4 optimizer update(s) of 128 rollouts" in out
    assert "GSM8K-v0" in out and "75.0%" in out
    assert main(["plan", str(path), "--set", "batch.global_batch_size=96"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_describe_plan_mentions_every_environment():
    text = describe_plan(plan_batches(make()))
    assert "Countdown-v0" in text and "token-level" in text


@pytest.mark.parametrize(("setting", "value"), [("train.num_ranks", 0), ("train.num_steps", 0),
                                                ("rollout.max_turns", 0)])
def test_zero_counts_are_refused(setting, value):
    section, key = setting.split(".")
    with pytest.raises(ConfigError, match=f"{section}.{key} = {value} is out of range: it must "
                       "be an integer >= 1"):
        make(**{section: {key: value}})


def test_deterministic_mode_needs_the_torch_engine():
    assert make(train={"deterministic": True}).train.deterministic
    with pytest.raises(ConfigError, match='train.deterministic = true needs rollout.engine = '
                       '"torch"'):
        make(train={"deterministic": True}, rollout={"engine": "vllm"})


@pytest.mark.parametrize("key", ["rollouts_every", "rollouts_random_per_env"])
def test_negative_rollout_sampling_is_refused(key):
    with pytest.raises(ConfigError, match=f"log.{key} = -1 is out of range"):
        make(log={key: -1})
    assert getattr(make(log={key: 0}).log, key) == 0  # 0 disables

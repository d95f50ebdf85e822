"""Plan-time checks: `agentrl plan` and `agentrl train` build each environment once and
read the model folder's config.json, and refuse (exit 2, one line, nothing written) what
would otherwise fail 20-30 s into training or run silently wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.envs import AgentEnv, Task
from agentrl.model import build_tiny_checkpoint
from agentrl.train.preflight import CHECKS, run_checks
from agentrl.train.preflight_facts import Preflight, accepted_keywords
from agentrl.types import Message

POSITIONS = 512


class ResetRaisesEnv(AgentEnv):
    """Builds fine; drawing a task raises (a missing data row, a broken generator)."""

    def sample_task(self, rng):
        raise RuntimeError("no task rows left")


class FlakyResetEnv(AgentEnv):
    """Drawing a task fails $FLAKY_FAILURES times (a server that drops a connection now
    and then), then works (the count is in the environment: the registry may import this
    module apart from pytest)."""

    def sample_task(self, rng):
        left = int(os.environ.get("FLAKY_FAILURES", "0"))
        if left > 0:
            os.environ["FLAKY_FAILURES"] = str(left - 1)
            raise ConnectionError("env server at 127.0.0.1:9 dropped the connection")
        return Task([Message("user", "Say hi.")], answer="hi", key=str(rng.integers(1000)))

    def grade(self, answer):
        return float(answer.strip() == "hi")

CONFIG = """
[model]
path = "{model}"
[batch]
rollout_batch_size = 2
n_samples_per_prompt = 2
global_batch_size = 4
max_tokens_per_microbatch = 512
[rollout]
max_new_tokens = 32
max_rollout_tokens = 64
[compaction]
strategy = "drop_oldest"
max_context_tokens = 256
[[environments]]
id = "agentrl/Countdown-v0"
kwargs = {{ num_numbers = 2 }}
[[environments]]
id = "agentrl/GSM8K-v0"
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300,
                                 max_position_embeddings=POSITIONS)


@pytest.fixture
def config_path(tmp_path, model_dir) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(model=model_dir))
    return path


def test_a_good_config_passes_and_plan_prints_each_check(config_path, capsys) -> None:
    assert main(["plan", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert "environments: Countdown-v0, GSM8K-v0 built" in out
    assert f"qwen2, {POSITIONS} positions" in out
    assert ("positions: longest row 288 of the model's 512 (compaction.max_context_tokens "
            "+ rollout.max_new_tokens = 256 + 32 = 288)") in out
    assert "micro-batch: budget 512 tokens holds the longest row (288)" in out


# (case from the issue or added, --set overrides, what the one error line must contain)
REFUSED = [
    ("unknown environment id", ['environments.0.id="agentrl/Countdwn-v0"'],
     "environments[0].id: unknown environment 'agentrl/Countdwn-v0'; did you mean "
     "'agentrl/Countdown-v0'?"),
    ("unknown environment keyword", ["environments.0.kwargs={num_numbrs=2}"],
     "environments[0].kwargs: agentrl/Countdown-v0 takes no keyword 'num_numbrs'; did you "
     "mean 'num_numbers'? it accepts: num_numbers, min_number, max_number, max_target, "
     "max_turns, render_mode, parser"),
    ("keyword the constructor refuses", ["environments.0.kwargs={num_numbers=0}"],
     "environments[0] (agentrl/Countdown-v0) cannot be built: ValueError: countdown: need "
     "num_numbers >= 1"),
    ("missing data file", ['environments.1.kwargs={path="no/such/train.jsonl"}'],
     f"environments[1] (agentrl/GSM8K-v0) cannot be built: ValueError: gsm8k: data file "
     f"no/such/train.jsonl does not exist (looked at {Path.cwd() / 'no/such/train.jsonl'})"),
    ("missing model.path", ['model.path="no/such/model"'],
     f"model.path = 'no/such/model' has no config.json (looked in "
     f"{Path.cwd() / 'no/such/model'}"),
    ("max_new_tokens past the model's positions", ["rollout.max_new_tokens=600",
                                                   "batch.max_tokens_per_microbatch=2048"],
     "rollout.max_new_tokens = 600 does not fit the model's 512 positions"),
    ("context budget past the positions", ["compaction.max_context_tokens=500",
                                           "batch.max_tokens_per_microbatch=2048"],
     "the longest row passes the model's 512 positions (max_position_embeddings of "),
    ("an environment whose reset raises", ['environments.1.id="tests.test_preflight:'
                                           'ResetRaisesEnv"', "environments.1.kwargs={}"],
     "environments[1] (tests.test_preflight:ResetRaisesEnv): its first prompt cannot be "
     "built: RuntimeError: no task rows left (it failed all 3 attempts, "
     "rollout.max_retries = 2); `agentrl check-env "
     "tests.test_preflight:ResetRaisesEnv` shows where"),
    ("micro-batch budget smaller than a row", ["batch.max_tokens_per_microbatch=200"],
     "batch.max_tokens_per_microbatch = 200 is smaller than the longest possible row "
     "(compaction.max_context_tokens + rollout.max_new_tokens = 256 + 32 = 288); raise "
     "batch.max_tokens_per_microbatch to at least 288"),
]


@pytest.mark.parametrize(("case", "overrides", "expected"), REFUSED,
                         ids=[case for case, _, _ in REFUSED])
@pytest.mark.parametrize("command", ["plan", "train"])
def test_refused_with_exit_2_and_one_line(config_path, tmp_path, capsys, command, case,
                                          overrides, expected) -> None:
    out = tmp_path / "out"
    argv = [command, str(config_path), *[a for o in overrides for a in ("--set", o)]]
    assert main(argv + (["--out", str(out)] if command == "train" else [])) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ") and expected in err[0], err[0]
    assert not out.exists()  # train refused before it made the run folder


def test_the_context_budget_names_the_knob_to_lower(config_path) -> None:
    config = load_config(config_path, ["compaction.max_context_tokens=500",
                                       "batch.max_tokens_per_microbatch=2048"])
    with pytest.raises(ConfigError) as info:
        run_checks(config)
    assert str(info.value).endswith(
        "compaction.max_context_tokens + rollout.max_new_tokens = 500 + 32 = 532; lower "
        "compaction.max_context_tokens (or rollout.max_new_tokens) by 20")


def test_without_compaction_the_prompt_counts(config_path) -> None:
    # one row per rollout: the first prompt (measured with the model's tokenizer and the
    # tools' schemas) plus every generated token must fit the positions
    config = load_config(config_path, ['compaction.strategy="none"',
                                       "rollout.max_rollout_tokens=480"])
    pf = Preflight(config)
    prompts = [pf.first_prompt_tokens(0), pf.first_prompt_tokens(1)]
    pf.close()
    assert all(p > 32 for p in prompts)
    longest = max(prompts)
    with pytest.raises(ConfigError) as info:
        run_checks(config)
    lines = str(info.value).splitlines()
    assert len(lines) == 2  # positions and the micro-batch budget both fail
    assert f"prompt ({longest} for " in lines[0]
    assert f"lower rollout.max_rollout_tokens (or turn compaction on) by {longest + 480 - 512}" \
        in lines[0]
    fits = load_config(config_path, ['compaction.strategy="none"',
                                     f"rollout.max_rollout_tokens={512 - longest}"])
    assert any("longest row 512 of the model's 512" in line for line in run_checks(fits))


def test_a_folder_without_weights_is_not_a_model(tmp_path, config_path, model_dir) -> None:
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text((model_dir / "config.json").read_text())
    config = load_config(config_path, [f'model.path="{folder}"'])
    with pytest.raises(ConfigError, match="has a config.json but no \\*.safetensors weights"):
        run_checks(config)


def test_every_failure_is_reported_once_and_checks_can_be_added(config_path) -> None:
    config = load_config(config_path, ['environments.0.id="agentrl/Nope-v0"',
                                       "batch.max_tokens_per_microbatch=100"])

    def first_prompt_fits(pf: Preflight) -> str:  # how a new check slots in
        raise ConfigError("compaction.max_context_tokens is too small for the first prompt")

    with pytest.raises(ConfigError) as info:
        run_checks(config, [*CHECKS, first_prompt_fits])
    lines = str(info.value).splitlines()
    assert [line.split(" ")[0] for line in lines] == [
        "environments[0].id:", "batch.max_tokens_per_microbatch", "compaction.max_context_tokens"]


def test_accepted_keywords_follow_kwargs_up_the_classes() -> None:
    from environments.gsm8k import GSM8KEnv

    assert accepted_keywords(GSM8KEnv) == ["path", "eval_path", "eval_every", "max_turns",
                                           "render_mode", "parser"]

    class Open:
        def __init__(self, **kwargs):
            pass

    assert accepted_keywords(Open) is None  # cannot know: every keyword is passed on


def test_lora_targets_are_checked_against_the_model_at_plan_time(tmp_path) -> None:
    from agentrl.config import config_from_dict

    folder = build_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=1,
                                   num_heads=2, num_kv_heads=1, vocab_size=300)
    raw = {"model": {"path": str(folder), "lora": {"rank": 4, "target_modules": ["v_proj"]}},
           "environments": [{"id": "agentrl/Countdown-v0"}]}
    lines = run_checks(config_from_dict(raw))
    assert any(line.startswith("LoRA: rank 4 on 1 projections, 192 adapter") for line in lines)
    raw["model"]["lora"]["target_modules"] = ["self_attn"]
    with pytest.raises(ConfigError, match="cannot take an adapter"):
        run_checks(config_from_dict(raw))


def test_a_reset_that_fails_now_and_then_is_retried_at_plan_time(config_path, capsys,
                                                                 monkeypatch) -> None:
    # one failed reset used to refuse the whole run ("its first prompt cannot be built")
    argv = ["plan", str(config_path), "--set",
            'environments.1.id="tests.test_preflight:FlakyResetEnv"', "--set",
            "environments.1.kwargs={}"]
    monkeypatch.setenv("FLAKY_FAILURES", "1")
    assert main(argv) == 0, capsys.readouterr().err
    monkeypatch.setenv("FLAKY_FAILURES", "1")
    assert main(argv + ["--set", "rollout.max_retries=0"]) == 2
    assert "(it failed all 1 attempts, rollout.max_retries = 0)" in capsys.readouterr().err

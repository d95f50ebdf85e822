"""Every config field has a declared range; a value outside it is refused at load time in
one line that names the setting, the value, the range and the fix."""

from __future__ import annotations

import math
import typing

import msgspec
import pytest

from agentrl.cli import main
from agentrl.config import Config, ConfigError, EnvironmentConfig, config_from_dict
from agentrl.config.ranges import describe_range

ONE_ENV = [{"id": "agentrl/Countdown-v0"}]

# (setting, out-of-range value, range in words): one row per bound of every range
OUT_OF_RANGE = [
    ("batch.rollout_batch_size", 0, "an integer >= 1"),
    ("batch.n_samples_per_prompt", 0, "an integer >= 1"),
    ("batch.global_batch_size", -4, "an integer >= 1"),
    ("batch.num_steps_per_rollout", 0, "an integer >= 1"),
    ("batch.max_tokens_per_microbatch", 0, "an integer >= 1"),
    ("batch.token_multiple", 0, "an integer >= 1"),
    ("loss.clip_eps_low", 5, "a finite number in [0, 1)"),
    ("loss.clip_eps_low", 1.0, "a finite number in [0, 1)"),
    ("loss.clip_eps_low", -0.1, "a finite number in [0, 1)"),
    ("loss.clip_eps_high", 1.5, "a finite number in [0, 1)"),
    ("loss.kl_coef", -0.1, "a finite number >= 0"),
    ("loss.kl_coef", math.inf, "a finite number >= 0"),
    ("loss.tis_cap", 0.5, "a finite number >= 1"),
    ("loss.tis_cap", math.inf, "a finite number >= 1"),
    ("optim.lr", -1e-3, "a finite number > 0"),
    ("optim.lr", 0.0, "a finite number > 0"),
    ("optim.lr", math.inf, "a finite number > 0"),
    ("optim.lr", math.nan, "a finite number > 0"),
    ("optim.weight_decay", -0.01, "a finite number >= 0"),
    ("optim.betas", [0.9, 1.0], "a finite number in [0, 1)"),
    ("optim.betas", [-0.1, 0.99], "a finite number in [0, 1)"),
    ("optim.warmup_steps", -1, "an integer >= 0"),
    ("optim.max_grad_norm", -1.0, "a finite number >= 0"),
    ("optim.max_grad_norm", math.inf, "a finite number >= 0"),
    ("rollout.temperature", -0.5, "a finite number >= 0"),
    ("rollout.temperature", math.inf, "a finite number >= 0"),
    ("rollout.top_p", 0, "a finite number in (0, 1]"),
    ("rollout.top_p", 5, "a finite number in (0, 1]"),
    ("rollout.max_new_tokens", 0, "an integer >= 1"),
    ("rollout.max_turns", 0, "an integer >= 1"),
    ("rollout.max_rollout_tokens", 0, "an integer >= 1"),
    ("rollout.max_subagent_depth", -1, "an integer >= 0"),
    ("rollout.max_subagents_per_rollout", -1, "an integer >= 0"),
    ("rollout.max_subagent_tokens", 0, "an integer >= 1"),
    ("rollout.step_timeout_s", 0, "a finite number > 0"),
    ("rollout.step_timeout_s", math.inf, "a finite number > 0"),
    ("rollout.rollout_timeout_s", -1.0, "a finite number > 0"),
    ("rollout.max_concurrent_rollouts", 0, "an integer >= 1"),
    ("rollout.max_extra_collections", -1, "an integer >= 0"),
    ("rollout.max_retries", -1, "an integer >= 0"),
    ("rollout.max_tool_errors", 0, "an integer >= 1"),
    ("compaction.max_context_tokens", 0, "an integer >= 1"),
    ("compaction.keep_last_turns", -1, "an integer >= 0"),
    ("compaction.max_compactions", -2, "an integer >= 0"),
    ("compaction.summary_max_tokens", 0, "an integer >= 1"),
    ("environments.0.weight", math.inf, "a finite number > 0"),
    ("environments.0.weight", 0.0, "a finite number > 0"),
    ("environments.0.weight", -1.0, "a finite number > 0"),
    ("environments.0.group_size", 0, "an integer >= 1"),
    ("environments.0.reward_scale", 0.0, "a finite number > 0"),
    ("environments.0.reward_scale", math.nan, "a finite number > 0"),
    ("train.num_steps", 0, "an integer >= 1"),
    ("train.seed", -1, "an integer in [0, 4294967296)"),
    ("train.checkpoint_every", -1, "an integer >= 0"),
    ("train.eval_every", -3, "an integer >= 0"),
    ("train.eval_tasks_per_env", 0, "an integer >= 1"),
    ("train.num_ranks", 0, "an integer >= 1"),
    ("train.collective_timeout_s", 0, "a finite number > 0"),
    ("train.max_invalid_fraction", 1.5, "a finite number in [0, 1]"),
    ("train.logprob_chunk_tokens", 0, "an integer >= 1"),
    ("rollout.max_staleness", -1, "an integer >= 0"),
    ("loss.relaxed_clip_eps_low", 1.0, "a finite number in [0, 1)"),
    ("loss.relaxed_clip_eps_high", -0.1, "a finite number >= 0"),
    ("loss.negative_advantage_veto", 1.0, "a finite number > 1"),
    ("optim.lr_reference_batch", 0, "an integer >= 1"),
    ("rollout.max_observation_chars", 0, "an integer >= 1"),
    ("rollout.num_engines", -1, "an integer >= 0"),
    ("rollout.tensor_parallel_size", 0, "an integer >= 1"),
    ("rollout.request_timeout_s", 0.0, "a finite number > 0"),
    ("rollout.weight_sync_bucket_mb", 0, "an integer >= 1"),
    ("rollout.weight_sync_timeout_s", -1.0, "a finite number > 0"),
    ("log.rollouts_every", -1, "an integer >= 0"),
    ("log.rollouts_random_per_env", -2, "an integer >= 0"),
    ("log.costs.per_generation_second", -0.5, "a finite number >= 0"),
    ("log.costs.per_env_second", -1.0, "a finite number >= 0"),
    ("log.costs.per_sandbox_second", math.inf, "a finite number >= 0"),
    ("log.costs.per_million_generated_tokens", -2.0, "a finite number >= 0"),
    ("log.costs.per_million_prompt_tokens", math.nan, "a finite number >= 0"),
    ("train.wait_for_rank0_timeout_s", -5.0, "a finite number > 0"),
    ("model.lora.rank", 0, "an integer >= 1"),
    ("model.lora.alpha", 0.0, "a finite number > 0"),
    ("model.lora.dropout", 1.0, "a finite number in [0, 1)"),
    ("environments.0.harness.timeout_s", 0.0, "a finite number > 0"),
    ("environments.0.harness.max_requests", 0, "an integer >= 1"),
    ("environments.0.harness.max_open_files", 0, "an integer >= 1"),
    ("environments.0.harness.max_processes", 0, "an integer >= 1"),
    ("endpoint.port", -1, "an integer >= 0"),
]


def _raw(setting: str, value: object) -> dict:
    raw: dict = {"environments": [dict(e) for e in ONE_ENV]}
    *path, last = setting.split(".")
    node: typing.Any = raw
    for key in path:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[last] = value
    return raw


def _shown(setting: str) -> str:
    """The name the message uses: environments.0.weight -> environments[0].weight."""
    return setting.replace(".0.", "[0].")


@pytest.mark.parametrize(("setting", "value", "words"), OUT_OF_RANGE,
                         ids=[f"{s}={v}" for s, v, _ in OUT_OF_RANGE])
def test_out_of_range_values_are_refused_in_one_line(setting, value, words) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(_raw(setting, value))
    message = str(info.value)
    assert "\n" not in message
    shown = _shown(setting)
    if isinstance(value, list):  # a tuple element is named by its index
        bad = next(i for i, v in enumerate(value) if not 0 <= v < 1)
        shown, value = f"{shown}[{bad}]", value[bad]
    assert message.startswith(f"{shown} = {value!r} is out of range: it must be {words}; ")
    assert "(default" in message  # the fix names the default to go back to


@pytest.mark.parametrize(("setting", "value"), [
    ("rollout.top_p", 1.0), ("rollout.top_p", 1e-9), ("loss.clip_eps_low", 0.0),
    ("rollout.temperature", 0.0), ("train.checkpoint_every", 0), ("optim.max_grad_norm", 0.0),
    ("loss.tis_cap", 1.0), ("loss.tis_cap", None), ("train.seed", 2**32 - 1),
    ("environments.0.weight", 1e-6), ("optim.betas", [0.0, 0.999999]),
])
def test_values_on_the_boundary_are_accepted(setting, value) -> None:
    config_from_dict(_raw(setting, value))


def test_a_config_built_in_python_is_checked_too() -> None:
    from agentrl.config import RolloutConfig
    from agentrl.config.checks import validate

    config = Config(environments=[EnvironmentConfig(id="agentrl/Countdown-v0")],
                    rollout=RolloutConfig(top_p=0.0))
    with pytest.raises(ConfigError, match=r"rollout.top_p = 0.0 is out of range"):
        validate(config)


def _core(annotation):
    """The type under Optional and Annotated: ``Annotated[int, ...] | None`` -> int."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _core(typing.get_args(annotation)[0])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, __import__("types").UnionType):
        return _core(args[0])
    return annotation


def _numeric_fields(struct_type: type, where: str = ""):
    """(setting, annotation) of every int/float field in the config tree."""
    hints = typing.get_type_hints(struct_type, include_extras=True)
    for field in msgspec.structs.fields(struct_type):
        annotation, core = hints[field.name], _core(hints[field.name])
        name = f"{where}{field.name}"
        inner = typing.get_args(core)[0] if typing.get_origin(core) is list else None
        if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
            yield from _numeric_fields(inner, f"{name}[].")
        elif typing.get_origin(core) is tuple:
            yield from ((name, arg) for arg in typing.get_args(core))
        elif isinstance(core, type) and issubclass(core, msgspec.Struct):
            yield from _numeric_fields(core, f"{name}.")
        elif core in (int, float):
            yield name, annotation


def _bounds(annotation) -> list[msgspec.Meta]:
    if typing.get_origin(annotation) is typing.Annotated:
        return [m for m in typing.get_args(annotation)[1:] if isinstance(m, msgspec.Meta)
                and (m.ge, m.gt, m.le, m.lt) != (None,) * 4]
    return [m for arg in typing.get_args(annotation) for m in _bounds(arg)]


def test_every_numeric_field_declares_its_range_and_is_in_the_table() -> None:
    fields = list(_numeric_fields(Config))
    assert len(fields) >= 35  # every number of every section, environments included
    missing = [name for name, annotation in fields if not _bounds(annotation)]
    assert not missing, f"fields without a declared range: {missing}"
    tested = {_shown(s).replace("[0]", "[]") for s, _, _ in OUT_OF_RANGE}
    assert {name for name, _ in fields} <= tested, {n for n, _ in fields} - tested


def test_describe_range_reads_like_the_docstrings() -> None:
    meta = msgspec.Meta
    assert describe_range([meta(gt=0, le=1)], True) == "a finite number in (0, 1]"
    assert describe_range([meta(ge=0, lt=1)], True) == "a finite number in [0, 1)"
    assert describe_range([meta(ge=1)], False) == "an integer >= 1"
    assert describe_range([meta(le=3)], False) == "an integer <= 3"


@pytest.mark.parametrize(("override", "setting"), [
    ("environments.0.weight=inf", "environments[0].weight = inf"),
    ("optim.lr=-1e-4", "optim.lr = -0.0001"),
    ("rollout.top_p=0", "rollout.top_p = 0"),
    ("rollout.top_p=5", "rollout.top_p = 5"),
    ("loss.clip_eps_low=5", "loss.clip_eps_low = 5"),
    ("train.checkpoint_every=-1", "train.checkpoint_every = -1"),
    ("rollout.step_timeout_s=0", "rollout.step_timeout_s = 0"),
])
@pytest.mark.parametrize("command", ["plan", "train"])
def test_the_cli_refuses_with_exit_2_and_one_line(tmp_path, capsys, command, override,
                                                  setting) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\n')
    out = tmp_path / "out"
    argv = [command, str(config), "--set", override]
    assert main(argv + (["--out", str(out)] if command == "train" else [])) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {setting} is out of range"), err
    assert not out.exists()  # refused before anything was written


def test_weight_inf_no_longer_crashes_plan(tmp_path) -> None:
    # it used to raise a traceback from the share arithmetic (inf / inf)
    import subprocess
    import sys

    config = tmp_path / "run.toml"
    config.write_text('[[environments]]\nid = "agentrl/Countdown-v0"\nweight = inf\n')
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "plan", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: environments[0].weight = inf is out of range: it must be a finite number > 0; "
        "give a relative weight such as 1.0; to leave an environment out, remove it "
        "(default 1.0)"]

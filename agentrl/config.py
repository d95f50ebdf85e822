"""Run configuration: nested msgspec Structs, TOML loading, ``--set`` overrides, validation.

Every field says its unit. Counts of the batch are in *rollouts* (responses) or
*groups*, never rows: a rollout that was compacted into several rows still counts once.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import msgspec


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the setting and the fix."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: unknown keys are refused."""


class ModelConfig(_Section):
    path: str = ""
    """Local Hugging Face folder (config.json, *.safetensors, tokenizer.json). Nothing is
    downloaded. Empty: the trainer builds or reuses the tiny built-in checkpoint."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype for training and the torch engine."""
    attention: Literal["auto", "flash", "torch"] = "auto"
    """Varlen attention backend: flash-attn when importable on a GPU ("auto"), else PyTorch."""


class BatchConfig(_Section):
    rollout_batch_size: int = 8
    """Groups (prompts) per collection."""
    n_samples_per_prompt: int = 4
    """Rollouts per group, for environments that do not set their own group_size."""
    global_batch_size: int = 32
    """Rollouts per optimizer update (never rows: compaction does not change it)."""
    num_steps_per_rollout: int | None = None
    """Optimizer updates per collection. Derived when absent; checked when given."""
    max_tokens_per_microbatch: int = 4096
    """Token budget of one packed micro-batch. Changes memory and speed, never the gradient."""


SEQUENCE_LEVEL_AGGREGATIONS = (
    "sequence",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "bnpo",
    "grpo",
    "sample",
)


class LossConfig(_Section):
    aggregation: str = "token"
    """Only "token": every generated token weighs 1 / (generated tokens in the update)."""
    clip_eps_low: float = 0.2
    """Lower clip of the policy ratio: ratios below 1 - clip_eps_low are clipped."""
    clip_eps_high: float = 0.28
    """Upper clip (DAPO's clip-higher): ratios above 1 + clip_eps_high are clipped."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference (initial) model; 0 disables it."""
    tis_cap: float | None = 2.0
    """Cap of the truncated importance weight trainer/engine probability; None disables."""
    old_logprobs: Literal["score", "engine"] = "score"
    """The ratio's old policy. "score": when a collection has several updates, a trainer
    scoring pass before the first one (the engine's log-probs when it has one);
    "engine": always the engine's log-probs (no scoring pass; the mismatch enters the
    ratio, and tis_cap does not apply)."""


class AdvantageConfig(_Section):
    estimator: Literal["grpo", "rloo", "dr_grpo"] = "grpo"
    """Baseline within each group: mean (grpo, dr_grpo) or leave-one-out mean (rloo)."""
    scale_by_std: bool = False
    """grpo only: divide by the group's population std + 1e-6."""


class OptimConfig(_Section):
    lr: float = 1e-5
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    """Optimizer updates of linear warm-up from 0 to lr."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; 0 disables it."""


class RolloutConfig(_Section):
    engine: Literal["torch", "vllm"] = "torch"
    """Inference engine: the built-in PyTorch engine (CPU) or vLLM (GPU, extra `gpu`)."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    """Generated tokens per turn."""
    max_turns: int = 8
    """Model turns per rollout."""
    max_rollout_tokens: int = 4096
    """Generated tokens per rollout, over all turns and segments."""
    step_timeout_s: float = 30.0
    """Seconds one env.step may take before the rollout is marked invalid."""
    rollout_timeout_s: float = 600.0
    """Seconds one whole rollout may take."""
    max_concurrent_rollouts: int = 64
    vllm_args: dict[str, Any] = {}
    """engine = "vllm": keyword arguments for ``VLLMEngine.from_pretrained`` and vLLM's
    engine args, e.g. ``{ gpu_memory_utilization = 0.5 }`` (the default: the trainer
    shares the GPU), ``enforce_eager``, ``kv_cache_memory_bytes``."""
    filter_uniform_groups: bool = False
    """Dynamic sampling: drop groups whose rewards are all equal and collect more."""
    max_extra_collections: int = 4
    """With filter_uniform_groups: extra collection rounds before falling back to
    training on what was kept (with a warning)."""


class CompactionConfig(_Section):
    strategy: Literal["none", "drop_oldest", "summarize"] = "none"
    max_context_tokens: int = 2048
    """Context tokens (prompt + history) a turn may start from before compaction."""
    keep_last_turns: int = 2
    """Turns kept after the system and task messages (and the summary, for summarize).
    The newest turn, with its tool result, is always kept, even with 0."""
    max_compactions: int = 4
    """Compactions per rollout; past it the rollout ends as truncated."""
    summary_max_tokens: int = 128
    """summarize: generated tokens for the summary."""


class EnvironmentConfig(_Section):
    id: str
    """A registered id ("agentrl/Countdown-v0") or "package.module:ClassName"."""
    weight: float = 1.0
    """Sampling weight: this environment's share of each collection's groups."""
    group_size: int | None = None
    """Rollouts per group for this environment; defaults to batch.n_samples_per_prompt."""
    reward_scale: float = 1.0
    """Multiplies this environment's rewards before advantages."""
    kwargs: dict[str, Any] = {}
    """Keyword arguments for the environment's constructor."""
    name: str = ""
    """Short name in metrics; defaults to the id's last part."""

    def display_name(self) -> str:
        """The name this environment has in metrics and reports."""
        if self.name:
            return self.name
        return self.id.split("/")[-1].split(":")[-1]


class TrainConfig(_Section):
    num_steps: int = 10
    """Training steps; one step is one collection and its num_steps_per_rollout updates."""
    seed: int = 0
    checkpoint_every: int = 0
    """Steps between checkpoints; 0: only at the end."""
    eval_every: int = 0
    """Steps between validations on held-out tasks; 0 disables them."""
    eval_tasks_per_env: int = 16
    """Held-out tasks per environment in each validation."""
    num_ranks: int = 1
    """Data-parallel ranks: `agentrl train` spawns one process per rank; rank 0 generates
    and broadcasts the rollouts, every rank trains on its share of the rows."""


class LogConfig(_Section):
    live: bool = True
    """Live terminal display during training."""
    tensorboard: bool = False


class Config(_Section):
    environments: list[EnvironmentConfig]
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)
    loss: LossConfig = msgspec.field(default_factory=LossConfig)
    advantage: AdvantageConfig = msgspec.field(default_factory=AdvantageConfig)
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    compaction: CompactionConfig = msgspec.field(default_factory=CompactionConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)

    def group_size(self, env: EnvironmentConfig) -> int:
        """Rollouts per group for one environment."""
        return env.group_size if env.group_size is not None else self.batch.n_samples_per_prompt


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file, apply ``section.key=value`` overrides, decode and validate."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    for override in overrides:
        apply_override(raw, override)
    resolve_env_files(raw, path.parent)
    return config_from_dict(raw, source=str(path))


def resolve_env_files(raw: dict[str, Any], config_dir: Path) -> None:
    """An environment id "file.py:Class" names a file relative to where agentrl runs, or
    else relative to the config file's folder: such ids get that folder's path, so a
    config beside its environment file runs from anywhere."""
    for env in raw.get("environments") or []:
        env_id = env.get("id") if isinstance(env, dict) else None
        if not isinstance(env_id, str) or ".py:" not in env_id:
            continue
        file, _, cls = env_id.rpartition(":")
        beside = config_dir / file
        if not Path(file).is_absolute() and not Path(file).exists() and beside.exists():
            env["id"] = f"{beside}:{cls}"


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Config:
    """Decode a plain dict into a validated Config."""
    check_unknown_keys(raw, Config, "")
    try:
        config = msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    validate(config)
    return config


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one ``a.b.c=value`` to a raw dict; the value is read as TOML, else as a string.

    A numeric part indexes a list: ``environments.0.weight=2``.
    """
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    dotted, _, text = override.partition("=")
    keys = dotted.strip().split(".")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    node: Any = raw
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, key, dotted)]
        else:
            node = node.setdefault(key, {})
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(node, last, dotted)] = value
    else:
        node[last] = value


def _list_index(node: list[Any], key: str, dotted: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ConfigError(f"override {dotted}: {key!r} is not an index below {len(node)}")
    return int(key)


def check_unknown_keys(raw: Any, struct_type: type, where: str) -> None:
    """Refuse keys that are not fields, naming the key and the closest valid one."""
    if not isinstance(raw, dict):
        return
    hints = typing.get_type_hints(struct_type)
    fields = [f.name for f in msgspec.structs.fields(struct_type)]
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean '{where}{close[0]}'?" if close else ""
            valid = ", ".join(fields)
            raise ConfigError(
                f"unknown setting '{where}{key}'{hint} (valid keys here: {valid})"
            )
        inner = _struct_inside(hints[key])
        if inner is None:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                check_unknown_keys(item, inner, f"{where}{key}[{i}].")
        else:
            check_unknown_keys(value, inner, f"{where}{key}.")


def _struct_inside(annotation: Any) -> type | None:
    """The Struct type held by an annotation (directly, in a list, or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    if typing.get_origin(annotation) in (list, types.UnionType, typing.Union):
        for arg in typing.get_args(annotation):
            found = _struct_inside(arg)
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------- validation


def validate(config: Config) -> None:
    """Refuse a configuration that cannot run, before anything is launched."""
    check_loss(config.loss)
    check_environments(config)
    check_positive(config)
    from agentrl.accounting import plan_batches

    plan_batches(config)  # raises ConfigError when the batch knobs do not divide


def check_loss(loss: LossConfig) -> None:
    """Only token-level aggregation is sound when rows depend on compaction."""
    if loss.aggregation == "token":
        return
    why = (
        "a sequence-level mean divides each rollout's loss by its number of rows or "
        "tokens, and the number of rows of a rollout depends on compaction, so the "
        "gradient would change with the context budget. agentrl only trains with "
        'aggregation = "token": each generated token weighs 1 / (generated tokens in '
        "the whole update)."
    )
    kind = "is a sequence-level mode" if loss.aggregation in SEQUENCE_LEVEL_AGGREGATIONS else (
        "is not a known aggregation"
    )
    raise ConfigError(f'loss.aggregation = "{loss.aggregation}" {kind}; {why}')


def check_positive(config: Config) -> None:
    """Counts and budgets that must be at least 1 (0 would silently do nothing)."""
    for section, name in (("train", "num_steps"), ("train", "num_ranks"),
                          ("rollout", "max_new_tokens"), ("rollout", "max_turns"),
                          ("rollout", "max_rollout_tokens"),
                          ("rollout", "max_concurrent_rollouts"),
                          ("compaction", "max_context_tokens")):
        value = getattr(getattr(config, section), name)
        if value < 1:
            raise ConfigError(f"{section}.{name} is {value}; it must be >= 1")
    if not config.rollout.temperature >= 0:
        raise ConfigError(f"rollout.temperature is {config.rollout.temperature}; use 0 "
                          "(greedy) or a positive temperature")


def check_environments(config: Config) -> None:
    """Each environment needs a positive weight and group size, and a unique name."""
    if not config.environments:
        raise ConfigError("no [[environments]] given; add at least one with an id")
    names: set[str] = set()
    for env in config.environments:
        if not env.weight > 0:
            raise ConfigError(
                f"environment {env.id!r} has weight {env.weight}; weights must be > 0 "
                "(remove the environment instead of giving it weight 0)"
            )
        if config.group_size(env) < 1:
            raise ConfigError(f"environment {env.id!r} has group_size {env.group_size}; need >= 1")
        name = env.display_name()
        if name in names:
            raise ConfigError(f"two environments are named {name!r}; set a distinct `name`")
        names.add(name)

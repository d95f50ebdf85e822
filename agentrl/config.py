"""Run configuration: nested msgspec Structs, TOML loading, ``--set`` overrides, validation.

Every field says its unit and its range. Counts of the batch are in *rollouts*
(responses) or *groups*, never rows: a rollout that was compacted into several rows
still counts once. Ranges are part of the field types (``agentrl.ranges``: e.g.
``Probability`` is (0, 1]); every float must also be finite. A value outside its range
is refused at load time in one line naming the setting, the value, the range and the fix.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agentrl.ranges import (
    ConfigError,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    UnitInterval,
    check_ranges,
    fix,
)


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: unknown keys are refused."""


class ModelConfig(_Section):
    path: str = ""
    """Local Hugging Face folder (config.json, *.safetensors, tokenizer.json), as given or
    relative to the project; `agentrl plan` checks it holds all three. Nothing is
    downloaded. Empty: the trainer builds or reuses the tiny built-in checkpoint."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """COMPUTE dtype of training forwards/backwards and of the engines. Master weights,
    gradients, their reduction over ranks and the optimizer state are always float32
    (FSDP2 mixed precision); log-probs and the loss are float32. "auto": bfloat16 on a
    GPU (flash-attn needs it), float32 on the CPU."""
    attention: Literal["auto", "flash", "torch"] = "auto"
    """Varlen attention backend: flash-attn when importable on a GPU ("auto"), else PyTorch."""


class BatchConfig(_Section):
    rollout_batch_size: PositiveInt = 8
    """Groups (prompts) per collection; >= 1."""
    n_samples_per_prompt: PositiveInt = 4
    """Rollouts per group, for environments that do not set their own group_size; >= 1."""
    global_batch_size: PositiveInt = 32
    """Rollouts per optimizer update (never rows: compaction does not change it); >= 1."""
    num_steps_per_rollout: PositiveInt | None = None
    """Optimizer updates per collection; >= 1. Derived when absent; checked when given."""
    max_tokens_per_microbatch: PositiveInt = 4096
    """Token budget of one packed micro-batch; >= 1, and `agentrl plan` refuses a budget
    below the longest possible row. Changes memory and speed, never the gradient."""


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
    clip_eps_low: UnitInterval = 0.2
    """Lower clip of the policy ratio: ratios below 1 - clip_eps_low are clipped; [0, 1)."""
    clip_eps_high: UnitInterval = 0.28
    """Upper clip (DAPO's clip-higher): ratios above 1 + clip_eps_high are clipped; [0, 1)."""
    kl_coef: Annotated[NonNegativeFloat, fix("use 0 to disable the KL term")] = 0.0
    """Weight of the k3 KL estimate to the reference (initial) model; >= 0, 0 disables it."""
    tis_cap: Annotated[float, Meta(ge=1)] | None = 2.0
    """Cap of the truncated importance weight trainer/engine probability (a ratio); >= 1
    (a cap below 1 would shrink every token's weight); None disables."""
    old_logprobs: Literal["score", "engine"] = "score"
    """The ratio's old policy. "score": when a collection has several updates, a trainer
    scoring pass before the first one (the engine's log-probs when it has one);
    "engine": always the engine's log-probs (no scoring pass; the mismatch enters the
    ratio, and tis_cap does not apply)."""


class AdvantageConfig(_Section):
    estimator: Literal["grpo", "rloo", "dr_grpo"] = "grpo"
    """Baseline within each group: mean (grpo, dr_grpo) or leave-one-out mean (rloo)."""
    scale_by_std: bool = False
    """grpo only: divide by the group's sample std (ddof=1, as verl, NeMo-RL and TRL) +
    1e-6; a group of one rollout gets advantage 0."""


class OptimConfig(_Section):
    lr: PositiveFloat = 1e-5
    """Peak AdamW learning rate (per optimizer update); a finite number > 0."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW decoupled weight decay (fraction of lr per update); >= 0."""
    betas: tuple[UnitInterval, UnitInterval] = (0.9, 0.999)
    """AdamW moment decay rates (per update); each in [0, 1)."""
    warmup_steps: NonNegativeInt = 0
    """Optimizer updates of linear warm-up from 0 to lr; >= 0."""
    max_grad_norm: Annotated[NonNegativeFloat, fix("use 0 to disable clipping")] = 1.0
    """Global gradient-norm clip (L2 norm); >= 0, 0 disables it."""


class RolloutConfig(_Section):
    engine: Literal["torch", "vllm"] = "torch"
    """Inference engine: the built-in PyTorch engine (CPU) or vLLM (GPU, extra `gpu`)."""
    temperature: Annotated[NonNegativeFloat, fix("use 0 for greedy decoding")] = 1.0
    """Sampling temperature (logits are divided by it); >= 0, 0 is greedy."""
    top_p: Annotated[Probability, fix("use 1.0 to sample from the whole distribution")] = 1.0
    """Nucleus sampling: draw from the smallest set of tokens holding this probability
    mass; (0, 1], 1.0 keeps every token."""
    max_new_tokens: PositiveInt = 256
    """Generated tokens per turn; >= 1, and below the model's max_position_embeddings."""
    max_turns: PositiveInt = 8
    """Model turns per rollout; >= 1."""
    max_rollout_tokens: PositiveInt = 2048
    """Generated tokens per rollout, over all turns and segments; >= 1. Without
    compaction a rollout is one row, so prompt + this must fit the model's positions."""
    step_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 30.0
    """Seconds one environment call (reset, tool_schemas, step, close) may take before the
    rollout is marked invalid, counted from the call's own start (never time spent
    waiting for a worker); > 0. The constructor gets rollout_timeout_s."""
    rollout_timeout_s: Annotated[PositiveFloat, fix("give a number of seconds > 0")] = 600.0
    """Seconds one whole rollout may take; > 0."""
    max_concurrent_rollouts: PositiveInt = 64
    """Rollouts in flight at once (the torch engine's batch slots); >= 1."""
    vllm_args: dict[str, Any] = {}
    """engine = "vllm": keyword arguments for ``VLLMEngine.from_pretrained`` and vLLM's
    engine args, e.g. ``{ gpu_memory_utilization = 0.5 }`` (the default: the trainer
    shares the GPU), ``enforce_eager``, ``kv_cache_memory_bytes``."""
    filter_uniform_groups: bool = False
    """Dynamic sampling: drop groups whose rewards are all equal and collect more."""
    max_extra_collections: NonNegativeInt = 4
    """With filter_uniform_groups: extra collection rounds before falling back to
    training on what was kept (with a warning); >= 0."""
    max_observation_chars: PositiveInt = 100_000
    """Characters of content one reset or step may return (all its messages together);
    >= 1. An environment that returns more breaks its contract: that rollout is invalid
    (``bad_observation``). Tools of an AgentEnv are cut well below it, with a marker."""
    num_engines: NonNegativeInt | None = None
    """Inference replicas the trainer starts itself (engines): each a TorchEngine with its
    own copy of the model, or a vLLM engine of tensor_parallel_size GPUs. Rollouts are
    spread over all replicas by load. None: 1, or 0 when remote_engines are given."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs per vLLM replica (tensor parallel); the built-in engine uses 1."""
    placement: Literal["colocated", "separate"] = "colocated"
    """Where local replicas run. "colocated": on the training GPUs (replica i on GPUs
    i·tp ...), asleep while the trainer trains (vLLM sleep mode; the built-in engine frees
    its KV cache), woken for the weight sync and generation. "separate": on GPUs of their
    own after the training GPUs (replica i on GPUs T + i·tp ..., T = training GPUs)."""
    sleep_level: Literal[1, 2] = 1
    """Colocated vLLM: 1 keeps a copy of the weights in host memory while asleep; 2 drops
    them (every sync sends all weights anyway; saves host memory)."""
    remote_engines: list[str] = []
    """Replicas served elsewhere, as base URLs ("http://10.0.0.2:8000"): `agentrl serve
    CONFIG` or `vllm serve` with the flags in docs/vllm.md. Driven token-in/token-out over
    HTTP; the trainer pushes its weights to them at start and after every step."""
    request_timeout_s: PositiveFloat = 600.0
    """Seconds one generation request to a remote replica may take; past it, or when the
    server cannot be reached, the rollout is invalid and the replica leaves service."""
    weight_transport: Literal["auto", "gloo", "nccl", "ipc", "files"] = "auto"
    """Data plane of weight syncs, through vLLM's weight-transfer API. "auto": CUDA IPC
    for vLLM colocated on the training GPUs, NCCL for vLLM on separate GPUs or servers,
    gloo on CPU and to `agentrl serve`. "files": the older safetensors-bucket path for vLLM
    builds without the weight-transfer API (local replicas only)."""
    weight_sync_host: str = ""
    """The trainer's address as remote replicas reach it (they join its gloo/NCCL
    rendezvous there); "" takes this machine's address on the route to each server."""
    weight_sync_bucket_mb: PositiveInt = 256
    """MiB of tensors per bucket of a weight sync (memory held at once while syncing)."""
    weight_sync_timeout_s: PositiveFloat = 300.0
    """Seconds each step of a weight sync (one bucket, start, finish) may take before the
    sync fails with an error naming the replica."""


class CompactionConfig(_Section):
    strategy: Literal["none", "drop_oldest", "summarize"] = "none"
    """What happens when a turn's context would pass max_context_tokens: "none" (the
    rollout is one row), "drop_oldest" turns, or a policy-written "summarize"."""
    max_context_tokens: PositiveInt = 2048
    """Context tokens (prompt + history) a turn may start from before compaction; >= 1,
    and max_context_tokens + rollout.max_new_tokens must fit the model's positions."""
    keep_last_turns: NonNegativeInt = 2
    """drop_oldest / summarize: turns kept after the system and task messages (and the
    summary, for summarize); >= 0. The newest turn, with its tool result, is always kept,
    even with 0."""
    max_compactions: NonNegativeInt = 4
    """Compactions per rollout; >= 0; past it the rollout ends as truncated."""
    summary_max_tokens: PositiveInt = 128
    """summarize: generated tokens for the summary; >= 1."""


class EnvironmentConfig(_Section):
    id: str
    """A registered id ("agentrl/Countdown-v0") or "package.module:ClassName"; `agentrl
    plan` builds it once to check the id, its kwargs and its data files."""
    weight: Annotated[PositiveFloat, fix("give a relative weight such as 1.0; to leave "
                                         "an environment out, remove it")] = 1.0
    """Sampling weight (relative): this environment's share of each collection's groups;
    a finite number > 0."""
    group_size: PositiveInt | None = None
    """Rollouts per group for this environment; >= 1; defaults to
    batch.n_samples_per_prompt."""
    reward_scale: PositiveFloat = 1.0
    """Multiplies this environment's rewards before advantages; a finite number > 0 (0
    would erase the reward, a negative scale invert it)."""
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
    num_steps: PositiveInt = 10
    """Training steps; one step is one collection and its num_steps_per_rollout updates;
    >= 1."""
    seed: Annotated[int, Meta(ge=0, lt=2**32)] = 0
    """Seed of every random generator (python, numpy, torch, the sampler, the engine);
    in [0, 2**32)."""
    checkpoint_every: Annotated[NonNegativeInt, fix("use 0 to checkpoint only at the end")] = 0
    """Steps between checkpoints; >= 0, 0: only at the end."""
    eval_every: Annotated[NonNegativeInt, fix("use 0 to disable validation")] = 0
    """Steps between validations on held-out tasks; >= 0, 0 disables them."""
    eval_tasks_per_env: PositiveInt = 16
    """Held-out tasks per environment in each validation; >= 1."""
    num_ranks: PositiveInt = 1
    """Data-parallel ranks on THIS machine, >= 1: a shortcut for `torchrun --standalone
    --nproc-per-node num_ranks -m agentrl train ...` (the same code path). Under torchrun
    (one or many machines) torchrun's process count decides and this must stay 1 or equal
    it. Rank 0 generates and broadcasts the rollouts; every rank trains on its share."""
    deterministic: bool = False
    """Results that do not depend on batching or timing, so a resume is bit-exact: the
    torch engine decodes batch-invariantly (every slot, whole span, every step) and a
    collection keeps groups in launch order. Needs rollout.engine = "torch"; slower
    decoding (bench/batch_invariance.py). Off: a resume loses no rollout and trains none
    twice, counters and metrics continue exactly, and the weights continue from the
    checkpoint, but the samples after it may differ in the last bits (docs/resume.md)."""
    collective_timeout_s: PositiveFloat | None = None
    """Seconds any collective (all-reduce, all-gather, broadcast) may take before the job
    fails. None: derived above the rollout and validation budgets (see
    ``agentrl.parallel.timeouts``). Ranks never sit in a collective while rank 0 generates,
    validates or checkpoints; they wait with ``wait_for_rank0_timeout_s``."""
    wait_for_rank0_timeout_s: PositiveFloat | None = None
    """Seconds ranks 1..N wait (outside any collective) for rank 0 to finish a collection,
    a validation or a checkpoint. None: derived from the rollout and validation budgets."""
    max_invalid_fraction: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """Stop the run when more than this share of an environment's recent rollouts are
    invalid (judged over its newest steps holding at least 16 of its rollouts, kept or
    dropped; see ``agentrl.rollout.health``). In [0, 1]; 1.0 never stops."""
    activation_checkpointing: Literal["auto"] | bool = "auto"
    """Recompute each decoder layer in backward instead of keeping its activations: the
    layers then keep only their input (hidden_size values per token and layer) at the
    cost of about one more forward. "auto": on when training on a GPU, off on CPU;
    true / false force it. `agentrl plan --gpu-memory` shows what it saves."""
    logprob_chunk_tokens: PositiveInt = 1024
    """Positions per chunk when the training forward turns hidden states into log-probs
    (>= 1): the head's transient tensors are [chunk, vocabulary] (never [micro-batch,
    vocabulary])."""


class LogConfig(_Section):
    live: bool = True
    """Live terminal display during training."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder."""
    rollouts_every: NonNegativeInt = 1
    """Steps between rollout samples written to RUN_DIR/rollouts/step_NNNNNN.jsonl (per
    environment the best, the worst and a few random rollouts, decoded); >= 0; 0 disables."""
    rollouts_random_per_env: NonNegativeInt = 2
    """Rollouts per environment drawn at random (seeded by train.seed and the step) for
    each sample, besides the best and the worst; >= 0."""


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
    check_ranges(raw, Config)  # before msgspec, whose own range message names no fix
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
    """Refuse a configuration that cannot run, before anything is launched.

    Checks what the config alone decides; what needs the environments or the model
    folder is checked by ``agentrl.preflight`` (run by `agentrl plan` and `train`).
    """
    check_ranges(msgspec.to_builtins(config), Config)  # also for Configs built in Python
    check_loss(config.loss)
    check_environments(config)
    check_deterministic(config)
    check_engines(config.rollout)
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


def check_deterministic(config: Config) -> None:
    """Batch-invariant generation is the built-in engine's; vLLM's is not wired in."""
    if config.train.deterministic and config.rollout.engine != "torch":
        raise ConfigError(
            f'train.deterministic = true needs rollout.engine = "torch" (batch-invariant '
            f'decoding), not "{config.rollout.engine}"; set train.deterministic = false (a '
            "resume then loses no rollout, but samples may differ in the last bits)")


def check_environments(config: Config) -> None:
    """At least one environment, and a unique name for each (weights: see the ranges)."""
    if not config.environments:
        raise ConfigError("no [[environments]] given; add at least one with an id")
    names: set[str] = set()
    for env in config.environments:
        name = env.display_name()
        if name in names:
            raise ConfigError(f"two environments are named {name!r}; set a distinct `name`")
        names.add(name)


def check_engines(rollout: RolloutConfig) -> None:
    """Replica counts, parallelism and server URLs that can run."""
    import urllib.parse

    if num_local_engines(rollout) + len(rollout.remote_engines) < 1:
        raise ConfigError("rollout.num_engines = 0 and no rollout.remote_engines: nothing "
                          "would generate; start a local engine or list a server")
    if rollout.tensor_parallel_size > 1 and rollout.engine != "vllm":
        raise ConfigError(f"rollout.tensor_parallel_size = {rollout.tensor_parallel_size} "
                          'needs engine = "vllm"; the built-in engine runs on one device')
    for url in rollout.remote_engines:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ConfigError(f"rollout.remote_engines: {url!r} is not http://HOST:PORT "
                              "(the address `agentrl serve` prints)")
    if rollout.weight_transport in ("files", "ipc") and rollout.remote_engines:
        raise ConfigError(f'rollout.weight_transport = "{rollout.weight_transport}" works '
                          "for local vLLM replicas only (shared files / GPUs); "
                          'remote_engines sync over "auto" (gloo or NCCL)')


def num_local_engines(rollout: RolloutConfig) -> int:
    """Replicas the trainer starts: num_engines, or its default (1; 0 with servers)."""
    if rollout.num_engines is not None:
        return rollout.num_engines
    return 0 if rollout.remote_engines else 1

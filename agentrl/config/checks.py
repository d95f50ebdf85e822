"""Load-time checks of a whole config: what one field's range cannot say (combinations of
settings, the loss mode, environment names, engine URLs) and the batch arithmetic.

``agentrl.config.load.config_from_dict`` runs :func:`validate` on every config it builds;
what needs the environments or the model folder is checked later, by
``agentrl.train.preflight`` (run by `agentrl plan` and `agentrl train`).
"""

from __future__ import annotations

import msgspec

from agentrl.config.env_settings import HarnessConfig
from agentrl.config.ranges import ConfigError, check_ranges
from agentrl.config.rollout_settings import RolloutConfig
from agentrl.config.settings import Config, num_local_engines
from agentrl.config.train_settings import SEQUENCE_LEVEL_AGGREGATIONS, LossConfig


def validate(config: Config) -> None:
    """Refuse a configuration that cannot run, before anything is launched.

    Checks what the config alone decides; what needs the environments or the model
    folder is checked by ``agentrl.train.preflight`` (run by `agentrl plan` and `train`).
    """
    check_ranges(msgspec.to_builtins(config), Config)  # also for Configs built in Python
    check_loss(config.loss)
    check_environments(config)
    check_deterministic(config)
    check_engines(config.rollout)
    check_off_policy(config)
    check_lora(config)
    from agentrl.config.schedule import check_lr_scaling

    check_lr_scaling(config)
    from agentrl.config.accounting import plan_batches

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


def check_off_policy(config: Config) -> None:
    """Asynchronous collection and the off-policy corrections: settings that combine."""
    rollout, loss = config.rollout, config.loss
    if rollout.inflight_updates and rollout.max_staleness == 0:
        raise ConfigError("rollout.inflight_updates = true needs rollout.max_staleness >= 1: "
                          "the synchronous loop never updates weights while generating")
    if rollout.inflight_updates and (rollout.engine != "torch" or rollout.remote_engines):
        raise ConfigError('rollout.inflight_updates = true needs local built-in replicas '
                          '(rollout.engine = "torch", no remote_engines): they take new '
                          "weights between two decode steps; drop it (weights then change "
                          "between collections)")
    if rollout.collector == "process" and rollout.max_staleness == 0:
        raise ConfigError('rollout.collector = "process" moves the asynchronous collector '
                          "into a process of its own; it needs rollout.max_staleness >= 1 "
                          '(or use collector = "thread", the default)')
    if (rollout.collector == "process" and rollout.engine == "vllm"
            and num_local_engines(rollout) > 0):
        raise ConfigError('rollout.collector = "process" runs the built-in engine or '
                          "remote_engines; local vLLM replicas already generate in processes "
                          'of their own: use collector = "thread" with them')
    if (rollout.max_staleness > 0 and rollout.engine == "vllm"
            and rollout.placement == "colocated" and num_local_engines(rollout) > 0):
        raise ConfigError(f"rollout.max_staleness = {rollout.max_staleness} generates while "
                          "the trainer trains, so vLLM cannot sleep on the training GPUs: set "
                          'rollout.placement = "separate" (or remote_engines), or use 0')
    if loss.objective == "decoupled" and (loss.old_logprobs != "score" or loss.tis_cap is None):
        raise ConfigError('loss.objective = "decoupled" clips around a proximal policy the '
                          'trainer scores, so it needs loss.old_logprobs = "score" and a '
                          "loss.tis_cap (the cap of its behaviour weight, e.g. 2.0)")
    for name, standard in (("low", loss.clip_eps_low), ("high", loss.clip_eps_high)):
        relaxed = getattr(loss, f"relaxed_clip_eps_{name}")
        if relaxed is not None and relaxed < standard:
            raise ConfigError(f"loss.relaxed_clip_eps_{name} = {relaxed} is narrower than "
                              f"loss.clip_eps_{name} = {standard}; relaxed clipping widens "
                              "the interval for stale tokens")


def check_lora(config: Config) -> None:
    """What LoRA (``[model.lora]``) can run with: a frozen embedding, engines that take
    adapters (the built-in one, local or served by `agentrl serve`, and local vLLM)."""
    lora, rollout = config.model.lora, config.rollout
    if lora is None:
        return
    if lora.train_embeddings:
        raise ConfigError("model.lora.train_embeddings = true is not supported: adapter-only "
                          "weight syncs and the adapter versions engines keep need a frozen "
                          "embedding and LM head; set it to false, or drop [model.lora] to "
                          "train every weight")
    if not lora.target_modules:
        raise ConfigError("model.lora.target_modules is empty; name the projections to adapt, "
                          'e.g. ["q_proj", "k_proj", "v_proj", "o_proj"]')
    if rollout.engine == "vllm" and rollout.remote_engines:
        raise ConfigError("[model.lora] with remote vLLM servers is not supported: a vLLM "
                          "server loads adapters from its own disk; use local vLLM replicas "
                          '(rollout.num_engines) or `agentrl serve` (rollout.engine = "torch")')


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
        if env.harness is not None:
            check_harness(name, env.harness)


def check_harness(name: str, harness: HarnessConfig) -> None:
    """A harness runs one program: a callable or a command line, with its own options."""
    where = f"environment {name!r}: harness"
    if bool(harness.run) == bool(harness.command):
        raise ConfigError(f"{where} needs exactly one of run = \"file.py:function\" (a "
                          "Python callable) or command = [\"program\", \"arg\", ...]")
    if harness.run and ":" not in harness.run:
        raise ConfigError(f"{where}.run = {harness.run!r}: name the callable as "
                          "\"path/to/file.py:function\" or \"package.module:function\"")
    if harness.sandbox and not harness.command:
        raise ConfigError(f"{where}.sandbox = true sandboxes a command line; a callable "
                          "runs in this interpreter (use isolation = \"process\" for it)")
    if harness.grader and ":" not in harness.grader:
        raise ConfigError(f"{where}.grader = {harness.grader!r}: name it as "
                          "\"file.py:function\" or \"package.module:function\"")


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

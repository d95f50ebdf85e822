"""The four batch knobs, counted in rollouts, and the plan they imply.

``rollout_batch_size`` groups × group size = rollouts per collection
= ``global_batch_size`` rollouts per update × ``num_steps_per_rollout`` updates.
Rows never enter this arithmetic: compaction changes how many rows a rollout has,
not how much it counts.
"""

from __future__ import annotations

import msgspec

from agentrl.config.ranges import ConfigError
from agentrl.config.settings import Config


class EnvShare(msgspec.Struct):
    """One environment's expected part of every collection."""

    name: str
    id: str
    share: float
    """Normalized sampling weight: the fraction of groups this environment gets."""
    num_groups: float
    """Groups per collection (exact when group sizes differ, else the expectation)."""
    group_size: int
    num_rollouts: float


class BatchPlan(msgspec.Struct):
    """How one collection turns into optimizer updates."""

    num_groups: int
    num_rollouts: int
    """Rollouts per collection."""
    num_updates: int
    """Optimizer updates per collection (num_steps_per_rollout)."""
    rollouts_per_update: int
    """global_batch_size."""
    max_tokens_per_microbatch: int
    envs: list[EnvShare]


def plan_batches(config: Config) -> BatchPlan:
    """Check that the batch knobs divide exactly and return the plan; ConfigError otherwise."""
    batch = config.batch
    for name in ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size",
                 "max_tokens_per_microbatch"):
        if getattr(batch, name) < 1:
            raise ConfigError(f"batch.{name} is {getattr(batch, name)}; it must be >= 1")
    envs = _env_shares(config)
    num_rollouts = round(sum(e.num_rollouts for e in envs))
    num_updates = _num_updates(config, num_rollouts, _how_counted(config, envs))
    return BatchPlan(
        num_groups=batch.rollout_batch_size,
        num_rollouts=num_rollouts,
        num_updates=num_updates,
        rollouts_per_update=batch.global_batch_size,
        max_tokens_per_microbatch=batch.max_tokens_per_microbatch,
        envs=envs,
    )


def _env_shares(config: Config) -> list[EnvShare]:
    total_weight = sum(env.weight for env in config.environments)
    num_groups = config.batch.rollout_batch_size
    sizes = {config.group_size(env) for env in config.environments}
    shares = []
    for env in config.environments:
        share = env.weight / total_weight
        groups = num_groups * share
        if len(sizes) > 1 and abs(groups - round(groups)) > 1e-9:
            raise ConfigError(
                f"environments have different group sizes ({_sizes_text(config)}), so each "
                "environment's groups per collection must be a whole number for a collection "
                f"to hold a fixed number of rollouts; rollout_batch_size {num_groups} × share "
                f"{share:.3f} = {groups:.2f} groups for {env.display_name()!r}. Make "
                "rollout_batch_size × share whole, or give every environment the same group_size."
            )
        if len(sizes) > 1:
            groups = float(round(groups))
        size = config.group_size(env)
        shares.append(EnvShare(env.display_name(), env.id, share, groups, size, groups * size))
    return shares


def _sizes_text(config: Config) -> str:
    return ", ".join(f"{e.display_name()} {config.group_size(e)}" for e in config.environments)


def _how_counted(config: Config, envs: list[EnvShare]) -> str:
    if len({e.group_size for e in envs}) == 1:
        return f"{config.batch.rollout_batch_size} groups × {envs[0].group_size} samples"
    return " + ".join(f"{e.num_groups:g} {e.name} groups × {e.group_size}" for e in envs)


def _num_updates(config: Config, num_rollouts: int, counted: str) -> int:
    per_update = config.batch.global_batch_size
    given = config.batch.num_steps_per_rollout
    if given is not None:
        if given < 1:
            raise ConfigError(f"batch.num_steps_per_rollout is {given}; it must be >= 1")
        if given * per_update != num_rollouts:
            raise ConfigError(
                f"global_batch_size {per_update} × num_steps_per_rollout {given} = "
                f"{given * per_update} rollouts, but a collection has {counted} = "
                f"{num_rollouts} rollouts; set num_steps_per_rollout = "
                f"{num_rollouts / per_update:g} or drop it to derive it"
            )
        return given
    if num_rollouts % per_update:
        divisors = [d for d in range(1, num_rollouts + 1) if num_rollouts % d == 0]
        near = sorted(divisors, key=lambda d: abs(d - per_update))[:3]
        raise ConfigError(
            f"global_batch_size {per_update} does not divide {counted} = {num_rollouts} "
            f"rollouts; choose a divisor of {num_rollouts} such as "
            f"{', '.join(map(str, sorted(near)))}"
        )
    return num_rollouts // per_update


def describe_plan(plan: BatchPlan) -> str:
    """The accounting as a person reasons about it, one fact per line."""
    sizes = {e.group_size for e in plan.envs}
    if len(sizes) == 1:
        head = f"{plan.num_groups} groups × {sizes.pop()} samples = {plan.num_rollouts} rollouts"
    else:
        head = f"{plan.num_groups} groups = {plan.num_rollouts} rollouts"
    lines = [
        f"per collection: {head}",
        f"  → {plan.num_updates} optimizer update(s) of {plan.rollouts_per_update} rollouts each",
        f"micro-batch token budget: {plan.max_tokens_per_microbatch} tokens "
        "(packing only; the gradient does not depend on it)",
        "loss: token-level; each generated token weighs 1 / (generated tokens in its update)",
        "environments:",
    ]
    for env in plan.envs:
        lines.append(
            f"  {env.name:<16} share {env.share:6.1%}  {env.num_groups:g} groups × "
            f"{env.group_size} = {env.num_rollouts:g} rollouts per collection  ({env.id})"
        )
    return "\n".join(lines)

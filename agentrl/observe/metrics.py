"""Step metadata: what one step trained on, counted in groups, rollouts, rows and tokens.

Every count is given overall and per environment, because the environments of a mix
learn at different speeds and a single average hides that.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from agentrl.observe.compaction import compaction_figures
from agentrl.reassembler import num_trained_tokens
from agentrl.types import (
    MAIN_THREAD,
    SUBAGENT_FAILURES,
    TRUNCATION_REASONS,
    Group,
    Rollout,
)


class Counts(msgspec.Struct):
    """Counts for one environment or for the whole step."""

    num_groups: int = 0
    num_rollouts: int = 0
    num_rows: int = 0
    num_sampled_tokens: int = 0
    """Tokens the policy generated, valid rollouts or not."""
    num_trainable_tokens: int = 0
    """Generated tokens of valid rollouts: the loss normalizer N of the step."""
    num_uniform_groups: int = 0
    """Groups whose valid rollouts all have the same reward (no GRPO signal)."""
    num_invalid_rollouts: int = 0
    reward_sum: float = 0.0

    @property
    def mixed_group_fraction(self) -> float:
        """Share of groups whose rewards differ: the part of the batch that teaches."""
        if not self.num_groups:
            return 0.0
        return (self.num_groups - self.num_uniform_groups) / self.num_groups

    @property
    def reward_mean(self) -> float:
        """Mean reward over rollouts (each rollout once, whatever its rows)."""
        return self.reward_sum / self.num_rollouts if self.num_rollouts else 0.0

    def add(self, other: Counts) -> None:
        """Accumulate another environment's counts into this one."""
        for field in self.__struct_fields__:
            setattr(self, field, getattr(self, field) + getattr(other, field))

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat metric names → values, with derived figures."""
        out: dict[str, float] = {f"{prefix}{f}": getattr(self, f) for f in self.__struct_fields__
                                 if f != "reward_sum"}
        out[f"{prefix}mixed_group_fraction"] = self.mixed_group_fraction
        out[f"{prefix}reward/mean"] = self.reward_mean
        return out


class StepStats(msgspec.Struct):
    """One step's counts, overall and per environment."""

    step: int
    total: Counts
    per_env: dict[str, Counts]

    def to_flat_dict(self) -> dict[str, float]:
        """`num_rollouts`, `reward/mean`, `env/<name>/num_rollouts`, … for the metrics log."""
        flat: dict[str, float] = {"step": self.step, **self.total.as_dict()}
        for name, counts in sorted(self.per_env.items()):
            flat.update(counts.as_dict(prefix=f"env/{name}/"))
        return flat

    def to_json_line(self) -> str:
        """One JSON line, as written to metrics.jsonl."""
        return msgspec.json.encode(self.to_flat_dict()).decode()


def drop_reason(group: Group) -> str | None:
    """Why a group carries no learning signal ("all invalid", "uniform reward 1"), or None
    when its valid rewards differ. The one definition of a uniform group: dynamic sampling
    drops these, and StepStats counts them."""
    valid = [r.reward for r in group.rollouts if r.trainable]
    if not valid:
        return "all invalid"
    if len(set(valid)) == 1:
        return f"uniform reward {valid[0]:g}"
    return None


def step_stats(step: int, rollouts: Sequence[Rollout],
               summary_tokens: str = "train") -> StepStats:
    """Count what a step's rollouts hold, overall and per environment
    (``summary_tokens``: ``loss.summary_tokens``, which decides the trained tokens)."""
    per_env: dict[str, Counts] = defaultdict(Counts)
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        groups[rollout.group_id].append(rollout)
        valid = rollout.trainable
        counts = per_env[rollout.env]
        counts.num_rollouts += 1
        counts.num_rows += len(rollout.segments)
        counts.num_sampled_tokens += rollout.num_generated_tokens
        counts.num_trainable_tokens += num_trained_tokens(rollout, summary_tokens) \
            if valid else 0
        counts.num_invalid_rollouts += 0 if valid else 1
        counts.reward_sum += rollout.reward
    for group_id, members in groups.items():
        counts = per_env[members[0].env]
        counts.num_groups += 1
        reason = drop_reason(Group(group_id, members[0].env, members))
        counts.num_uniform_groups += reason is not None
    total = Counts()
    for counts in per_env.values():
        total.add(counts)
    return StepStats(step=step, total=total, per_env=dict(per_env))


def rollout_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """Response length, truncation, compaction, turn and tool-error figures of rollouts."""
    if not rollouts:
        return {}
    n = len(rollouts)
    figures = {
        f"{prefix}response_length/mean": sum(r.num_generated_tokens for r in rollouts) / n,
        f"{prefix}truncation_rate": sum(r.stats.truncated for r in rollouts) / n,
        f"{prefix}num_turns/mean": sum(r.stats.num_turns for r in rollouts) / n,
        f"{prefix}num_compactions/mean": sum(r.stats.num_compactions for r in rollouts) / n,
        f"{prefix}invalid_rate": sum(not r.trainable for r in rollouts) / n,
        f"{prefix}tool_errors": float(sum(sum(r.stats.tool_errors.values()) for r in rollouts)),
        **truncation_figures(rollouts, prefix),
    }
    figures.update(breakdown_figures(rollouts, prefix))
    figures.update(compaction_figures(rollouts, prefix))
    figures.update(subagent_figures(rollouts, prefix))
    return figures


def subagent_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """The rollout trees of non-empty ``rollouts`` (none when no rollout called a
    subagent): ``subagents/threads_per_rollout/mean`` (main + subagent threads that ran),
    ``subagents/calls_per_rollout/mean``, ``subagents/depth/mean`` and ``/max`` (deepest
    thread per rollout, 0 for none), ``subagents/generated_token_share`` (subagent tokens
    over all generated tokens) and ``subagents/failures/<reason>`` (every reason of
    ``SUBAGENT_FAILURES``, 0 included, and any environment failure in a thread)."""
    if not any(r.threads for r in rollouts):
        return {}
    n = len(rollouts)
    ran = [{s.thread for s in r.segments} - {MAIN_THREAD} for r in rollouts]
    depths = [max((t.depth for t in r.threads if t.thread_id in ids), default=0)
              for r, ids in zip(rollouts, ran, strict=True)]
    total = sum(r.num_generated_tokens for r in rollouts)
    delegated = sum(s.num_generated_tokens for r in rollouts for s in r.segments
                    if s.thread != MAIN_THREAD)
    failures = dict.fromkeys(SUBAGENT_FAILURES, 0)
    for rollout in rollouts:
        for thread in rollout.threads:
            if thread.error_kind is not None:
                failures[thread.error_kind] = failures.get(thread.error_kind, 0) + 1
    out = {
        f"{prefix}subagents/threads_per_rollout/mean": sum(1 + len(ids) for ids in ran) / n,
        f"{prefix}subagents/calls_per_rollout/mean": sum(len(r.threads) for r in rollouts) / n,
        f"{prefix}subagents/depth/mean": sum(depths) / n,
        f"{prefix}subagents/depth/max": float(max(depths)),
        f"{prefix}subagents/generated_token_share": delegated / total if total else 0.0,
    }
    out.update({f"{prefix}subagents/failures/{k}": float(v) for k, v in failures.items()})
    return out


def breakdown_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """Rows per rollout (compaction's effect on the batch) and tool errors by kind
    (``tool_errors/<kind>``, only the kinds that occurred) of non-empty ``rollouts``."""
    n = len(rollouts)
    out = {f"{prefix}rows_per_rollout/mean": sum(len(r.segments) for r in rollouts) / n}
    kinds: dict[str, int] = defaultdict(int)
    for rollout in rollouts:
        for kind, count in rollout.stats.tool_errors.items():
            kinds[kind] += count
    out.update({f"{prefix}tool_errors/{kind}": float(c) for kind, c in sorted(kinds.items())})
    out.update(harness_figures(rollouts, prefix))
    return out


def harness_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """Agent programs (docs/harnesses.md): their compactions by reason
    (``harness_compactions/<reason>``) and the rows that drift started (``harness_drift``),
    only where some occurred."""
    reasons: dict[str, int] = defaultdict(int)
    for rollout in rollouts:
        for reason, count in rollout.stats.harness_compactions().items():
            reasons[reason] += count
    out = {f"{prefix}harness_compactions/{r}": float(c) for r, c in sorted(reasons.items())}
    drift = sum(r.stats.num_drift for r in rollouts)
    if drift:
        out[f"{prefix}harness_drift"] = float(drift)
    return out


def truncation_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """Truncated rollouts counted by reason: ``truncated/<reason>`` for every reason of
    ``TRUNCATION_REASONS`` (0 included, so curves have no gaps), plus any other reason."""
    counts = dict.fromkeys(TRUNCATION_REASONS, 0)
    for rollout in rollouts:
        if rollout.stats.truncated:
            reason = rollout.stats.truncation_reason or "unknown"
            counts[reason] = counts.get(reason, 0) + 1
    return {f"{prefix}truncated/{reason}": float(n) for reason, n in counts.items()}


def collection_figures(dropped: dict[str, dict[str, int]], num_rounds: int,
                       fallback_groups: int) -> dict[str, float]:
    """Dynamic sampling: rounds run, groups dropped per environment and reason."""
    out: dict[str, float] = {
        "collection/num_rounds": num_rounds,
        "collection/fallback_groups": fallback_groups,
        "collection/dropped_groups": sum(sum(r.values()) for r in dropped.values()),
    }
    for env, reasons in dropped.items():
        for reason, count in reasons.items():
            out[f"env/{env}/dropped/{reason}"] = count
    return out


LOSS_FIGURES = ("loss", "policy_loss", "kl_loss", "clip_frac_low", "clip_frac_high",
                "approx_kl", "entropy", "mismatch", "tis_weight", "veto_frac")


def loss_figures(updates: Sequence[Any]) -> dict[str, float]:
    """Loss figures (UpdateStats) averaged over a step's updates, under ``loss/...``."""
    if not updates:
        return {}
    out = {f"loss/{name}": sum(getattr(u, name) for u in updates) / len(updates)
           for name in LOSS_FIGURES}
    out["loss/clip_frac"] = out["loss/clip_frac_low"] + out["loss/clip_frac_high"]
    out["loss/kl"] = out["loss/approx_kl"]
    return out

"""A batch as a worked example: groups, rollouts, rows, reward copies, baselines, advantages.

Each rollout reads like "rollout s0-g0-r0 · reward 1.0 · 4 rows · 7 generated tokens →
+0.5": compaction changes the number of rows, never how much the rollout counts. Each
row ends with the policy versions that generated its tokens ("policy v3 ×5, v4 ×2") when
they were recorded: several versions in one rollout come from asynchronous collection.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from agentrl.advantage import rollout_advantages
from agentrl.reassembler import to_rows
from agentrl.staleness import token_versions
from agentrl.types import MAIN_THREAD, Rollout, Row


def describe_batch(
    rollouts: list[Rollout], estimator: str = "grpo", scale_by_std: bool = False
) -> str:
    """The batch as text, ending with the counts the token-level loss normalizes by."""
    rows = to_rows(rollouts)
    advantages = rollout_advantages(rows, estimator, scale_by_std, rollouts)
    rows_of: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        rows_of[row.rollout_id].append(row)
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        groups[rollout.group_id].append(rollout)
    lines: list[str] = []
    for group_id, members in groups.items():
        lines.append(f"group {group_id} · {members[0].env} · {len(members)} rollouts")
        for rollout in members:
            lines.extend(_rollout_lines(rollout, rows_of[rollout.rollout_id],
                                        advantages[rollout.rollout_id]))
    lines.append(_totals(rollouts, rows))
    return "\n".join(lines)


def _rollout_lines(rollout: Rollout, rows: list[Row], adv) -> list[str]:
    tokens = sum(r.num_generated_tokens for r in rows)
    status = "" if rollout.valid else f" · INVALID ({rollout.stats.error}) → masked"
    head = (f"  rollout {rollout.rollout_id} · reward {rollout.reward:g} · {len(rows)} "
            f"row{'s' if len(rows) != 1 else ''} · {tokens} generated tokens")
    if rollout.valid:
        head += f" → {adv.advantage:+.3g}   (baseline {adv.baseline:.3g})"
    lines = [head + status]
    extras = []
    if rollout.stats.num_compactions:
        extras.append(f"{rollout.stats.num_compactions} compactions")
    if rollout.stats.truncated:
        extras.append("truncated")
    if rollout.stats.tool_errors:
        extras.append(f"tool errors {rollout.stats.tool_errors}")
    if rollout.threads:
        ran = len({row.thread for row in rows}) - 1
        extras.append(f"{ran + 1} threads (main + {ran} subagent), one reward and one "
                      "advantage for all their rows")
    if extras:
        lines.append(f"    {', '.join(extras)}")
    for row in rows:
        where = "" if row.thread == MAIN_THREAD else f" (thread {row.thread})"
        lines.append(
            f"    row {row.segment}{where}: {len(row.token_ids)} tokens "
            f"({row.num_prompt_tokens} prompt, {row.num_generated_tokens} generated) · "
            f"reward copy {row.reward:g} · "
            f"advantage {adv.advantage:+.3g} on each generated token{_versions_text(row)}"
        )
    return lines


def _versions_text(row: Row) -> str:
    """" · policy v3 ×5, v4 ×2": generated tokens per policy version ("" if unrecorded)."""
    if not row.version_runs:
        return ""
    versions = token_versions(row.version_runs, len(row.token_ids), -1)
    counts = Counter(v for v, m in zip(versions.tolist(), row.loss_mask, strict=True) if m)
    return " · policy " + ", ".join(f"v{v} ×{n}" for v, n in sorted(counts.items()))


def _totals(rollouts: list[Rollout], rows: list[Row]) -> str:
    valid = {r.rollout_id for r in rollouts if r.valid}
    tokens = sum(r.num_generated_tokens for r in rows if r.rollout_id in valid)
    return (
        f"batch: {len(rollouts)} rollouts ({len(valid)} valid) in {len(rows)} rows; the "
        f"token-level loss divides by {tokens} generated tokens of valid rollouts "
        "(rows only change the layout, not the weights)"
    )

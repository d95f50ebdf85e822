"""Compaction efficacy: how often rollouts compact, by whom, and whether it kept what the
task needs.

Logged per step overall and per environment (``env/<name>/compaction/...``):

- ``compaction/by_tool/mean``, ``compaction/by_budget/mean``: compactions per rollout that
  the policy called (``compact`` tool) and that the budget forced;
- ``compaction/by_template/mean``: rows started because the chat template re-rendered
  earlier turns (docs/models.md; only when there are such);
- ``compaction/compacted_share``: share of rollouts that compacted at least once;
- ``compaction/summary_tokens/mean``: generated tokens per summary (compactions with one);
- ``compaction/fact_survival``: of the environment's needed facts revealed before each
  compaction (``AgentEnv.needed_facts``), the share the compacted context still held,
  summed over compactions (only when the environment declares facts);
- ``reward/compacted``, ``reward/not_compacted``: mean reward of the rollouts that did
  and did not compact (each only when there are such rollouts).
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.types import Rollout


def compaction_figures(rollouts: Sequence[Rollout], prefix: str = "") -> dict[str, float]:
    """The figures above for non-empty ``rollouts``."""
    n = len(rollouts)
    records = [c for r in rollouts for c in r.stats.compactions]
    out = {
        f"{prefix}compaction/by_tool/mean": sum(c.cause == "tool" for c in records) / n,
        f"{prefix}compaction/by_budget/mean": sum(c.cause == "budget" for c in records) / n,
        f"{prefix}compaction/compacted_share": sum(
            r.stats.num_compactions > 0 for r in rollouts) / n,
    }
    by_template = sum(c.cause == "template" for c in records)
    if by_template:
        out[f"{prefix}compaction/by_template/mean"] = by_template / n
    summaries = [c.summary_tokens for c in records if c.summary is not None]
    if summaries:
        out[f"{prefix}compaction/summary_tokens/mean"] = sum(summaries) / len(summaries)
    revealed = sum(len(c.facts_revealed) for c in records)
    if revealed:
        kept = sum(len(c.facts_kept) for c in records)
        out[f"{prefix}compaction/fact_survival"] = kept / revealed
    for name, members in (("compacted", [r for r in rollouts if r.stats.num_compactions]),
                          ("not_compacted",
                           [r for r in rollouts if not r.stats.num_compactions])):
        if members:
            out[f"{prefix}reward/{name}"] = sum(r.reward for r in members) / len(members)
    return out

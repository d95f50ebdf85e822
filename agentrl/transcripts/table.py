"""Sampled rollouts as one table (a row per rollout), for experiment trackers."""

from __future__ import annotations

from typing import Any

from agentrl.transcripts.record import RolloutRecord

COLUMNS = ["step", "env", "selection", "reward", "valid", "num_turns", "num_rows",
           "num_generated_tokens", "invalid_reason", "truncation_reason", "transcript"]


def transcript_text(record: RolloutRecord) -> str:
    """The rollout's rows as plain text: each row's messages, ``[role] text``."""
    lines = []
    for row in record.rows:
        lines.append(f"--- row {row.index} (advantage {row.advantage:+.3f}) ---")
        for span in row.spans:
            lines += [f"[{m.role}] {m.text}" for m in span.messages]
    return "\n".join(lines)


def sample_table(records: list[RolloutRecord]) -> tuple[list[str], list[list[Any]]]:
    """The columns and one row per sampled rollout."""
    rows = [[r.step, r.env, r.selection, r.reward, r.valid, r.num_turns, r.num_rows,
             r.num_generated_tokens, r.invalid_reason or "", r.truncation_reason or "",
             transcript_text(r)] for r in records]
    return list(COLUMNS), rows

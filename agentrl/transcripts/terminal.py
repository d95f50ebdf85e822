"""Transcripts in the terminal: turn by turn, rows and advantages, compaction marked, and
with subagents the tree: each subagent thread after its caller's rows, indented, from the
call that started it to the answer it returned.

Model and environment text goes into ``rich.text.Text`` objects, never into markup, so
text such as ``[bold]`` or ``<script>`` prints as written.
"""

from __future__ import annotations

from typing import Any

from agentrl.transcripts.chat_text import ChatMessage
from agentrl.transcripts.record import (
    RolloutRecord,
    RowRecord,
    Span,
    ThreadBlock,
    thread_blocks,
)
from agentrl.types import MAIN_THREAD, Thread

ROLE_STYLES = {"system": "dim", "user": "green", "assistant": "bold", "tool": "cyan",
               "text": ""}
PART_STYLES = {"tool_call": "bold yellow on grey15", "note": "magenta italic"}
SYSTEM_CLIP = 400
"""Characters of a system message shown without --full (tool schemas make it long)."""


def render_records(records: list[RolloutRecord], console: Any, full: bool = False) -> None:
    """Print each record: a header of its figures, then every row's turns."""
    from rich.rule import Rule
    from rich.text import Text

    for record in records:  # titles as Text: names are shown as written, never as markup
        console.print(Rule(Text(_title(record)), style="bold blue"))
        console.print(summary_line(record))
        for block in thread_blocks(record):
            _render_thread(block, console, full)
        console.print()


def _render_thread(block: ThreadBlock, console: Any, full: bool) -> None:
    """One thread: the call that started it, its rows (compactions marked), its answer."""
    from rich.padding import Padding
    from rich.rule import Rule
    from rich.text import Text

    def say(renderable: Any) -> None:
        console.print(Padding(renderable, (0, 0, 0, 4 * block.depth)))

    node = block.node
    if node is not None:
        say(Rule(Text(f"thread {node.thread_id} ← {node.parent} called {node.origin}"),
                 style="bold cyan", align="left", characters="┄"))
    for number, row in enumerate(block.rows):
        if number > 0:
            note = row.compaction or (f"compaction {number}: row {row.index} starts from a "
                                      "compacted context")
            say(Rule(Text(note), style="magenta", characters="═"))
        say(Rule(Text(row_title(row)), style="blue", align="left"))
        for span in row.spans:
            for message in span.messages:
                say(_message_text(message, span, full))
    if node is not None and thread_outcome(node):
        say(Text(thread_outcome(node), style="cyan" if node.answer is not None else "red"))


def thread_outcome(node: Thread) -> str:
    """"↳ returned to main: 3428", or why the thread gave no answer; "" for a thread that
    returns nothing by design (an agent program's other conversation)."""
    if node.answer is None and node.error is None:
        return ""
    if node.answer is not None:
        return f"↳ returned to {node.parent}: {node.answer}"
    return f"↳ no answer for {node.parent} ({node.error_kind}): {node.error}"


def _title(record: RolloutRecord) -> str:
    return f"step {record.step} · {record.env} · {record.rollout_id} · {record.selection}"


def summary_line(record: RolloutRecord) -> Any:
    """Reward, validity, turns, compactions, rows, tokens, truncation, errors, versions."""
    from rich.text import Text

    text = Text()
    text.append(f"reward {record.reward:g}", style="bold")
    if record.valid:
        text.append(" · valid", style="green")
    else:
        text.append(f" · INVALID ({record.invalid_reason or 'no reason given'}) → masked",
                    style="bold red")
    if record.threads:
        ran = len({row.thread for row in record.rows} - {MAIN_THREAD})
        text.append(f" · {_count(ran + 1, 'thread')} (main + {ran} subagent)")
    text.append(f" · {_count(record.num_turns, 'turn')} · "
                f"{_count(record.num_compactions, 'compaction')} · "
                f"{_count(record.num_rows, 'row')} · {record.num_tokens} tokens "
                f"({record.num_generated_tokens} generated)")
    if record.truncated:
        reason = f" ({record.truncation_reason})" if record.truncation_reason else ""
        text.append(f" · truncated{reason}", style="yellow")
    if record.compaction_reasons:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(record.compaction_reasons.items()))
        text.append(f" · harness compactions: {reasons}", style="magenta")
    if record.num_drift:
        text.append(f" · drift {record.num_drift}", style="red")
    if record.tool_errors:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(record.tool_errors.items()))
        text.append(f" · tool errors: {errors}", style="red")
    if record.reward_components:
        parts = ", ".join(f"{k} {v:g}" for k, v in sorted(record.reward_components.items()))
        text.append(f" · reward parts: {parts}")
    if record.policy_versions:
        text.append(f" · policy versions {versions_text(record.policy_versions)}")
    return text


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def row_title(row: RowRecord) -> str:
    """"row 1 · advantage +0.5 · 90 tokens (60 prompt, 12 generated)" and versions."""
    where = "" if row.thread == MAIN_THREAD else f" · thread {row.thread}"
    title = (f"row {row.index}{where} · advantage {row.advantage:+.3g} · {row.num_tokens} tokens "
             f"({row.num_prompt_tokens} prompt, {row.num_generated_tokens} generated)")
    if not row.valid:
        title += " · invalid"
    if row.policy_versions:
        title += f" · policy {versions_text(row.policy_versions)}"
    return title


def versions_text(versions: list[int]) -> str:
    """"3" for one version, "3–5" for a span."""
    return str(versions[0]) if len(versions) == 1 else f"{versions[0]}–{versions[-1]}"


def _message_text(message: ChatMessage, span: Span, full: bool) -> Any:
    from rich.text import Text

    label = message.role
    if span.source == "prompt":
        label += " (prompt)"
    if span.summary:
        label += " (summary)"
    if span.source == "generated":
        label += f" ({span.num_tokens} tokens"
        label += f", policy {versions_text(span.policy_versions)})" if span.policy_versions \
            else ")"
    text = Text(f"{label:>24} │ ",
                style=ROLE_STYLES.get(message.role, ""))
    for part in message.parts:
        body = part.text
        if message.role == "system" and not full and len(body) > SYSTEM_CLIP:
            body = body[:SYSTEM_CLIP] + f" … [{len(body) - SYSTEM_CLIP} more characters; --full]"
        text.append(body, style=PART_STYLES.get(part.kind, ROLE_STYLES.get(message.role, "")))
    return text

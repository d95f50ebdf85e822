"""Did a compaction keep what the task needs? Facts revealed so far against the new context.

An environment may declare the facts its answer needs (``AgentEnv.needed_facts()``: e.g.
the entries a ledger's question asks for). The tracker notes which of them have appeared
in the conversation (task messages and observations, as text), and at every compaction
records which of those the compacted context still holds (in the summary or in the turns
kept after it). ``observe.compaction`` turns the records into information-survival
figures per environment.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentrl.types import Compaction


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else message.content
    return content if isinstance(content, str) else ""


class FactTracker:
    """The needed facts of one rollout and which of them have been revealed."""

    def __init__(self, needed: list[str], head: list[Any]) -> None:
        """``head``: the task's opening messages (facts stated there count as revealed)."""
        self.needed = list(dict.fromkeys(needed))
        self.revealed: list[str] = []
        self.see(head)

    def see(self, messages: list[Any]) -> None:
        """Note the needed facts that appear in these messages."""
        if not self.needed:
            return
        text = "\n".join(_text(m) for m in messages)
        for fact in self.needed:
            if fact not in self.revealed and fact in text:
                self.revealed.append(fact)

    def record(self, compaction: Compaction, context_text: str) -> Compaction:
        """``compaction`` with the facts revealed so far and those ``context_text`` (the
        compacted context, decoded) still holds."""
        kept = [fact for fact in self.revealed if fact in context_text]
        return msgspec.structs.replace(compaction, facts_revealed=list(self.revealed),
                                       facts_kept=kept)

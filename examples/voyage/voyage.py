"""Voyage: read a ship's log one entry at a time; the answer names the port the ship
left from (entry 1) and the cargo it unloaded (the last entry).

Long-trace environment written from docs/writing-environments.md section 8: the first
entry leaves a small context long before the answer, so only a `compact` summary can
carry the port to the end.

Provenance: written outside the repository by an author who read only README.md,
docs/writing-environments.md, docs/base-model.md and docs/compaction.md (never the
built-in environments nor agentrl's source), for issue 40's first target; copied here
(only this paragraph added, and the config's paths made relative) so the measurement in
README.md reproduces. Nothing in agentrl imports it.
"""

from __future__ import annotations

import numpy as np

from agentrl import AgentEnv, Grade, Message, Task, format_call, tool

PORTS = ("lisbon", "genoa", "bergen", "dakar", "cadiz", "malta", "riga", "tunis",
         "oslo", "porto", "naples", "hull")
CARGOES = ("salt", "tea", "wool", "rice", "silk", "coal", "wine", "iron", "cotton",
           "grain", "sugar", "timber")
FILLER = ("wind", "calm", "swell", "rain", "fog", "sail", "deck", "rope", "crew",
          "mast", "tide", "gull", "watch", "clear", "storm", "knots")
SYSTEM = ("Read the ship's log with next_entry, then reply <answer>Port: first port. "
          "Cargo: last cargo.</answer>")
LAST = "Log ends."


class VoyageEnv(AgentEnv):
    """Read every log entry, then name the first entry's port and the last entry's cargo."""

    def __init__(self, num_pages: int = 6, filler_words: int = 16, **kwargs):
        kwargs.setdefault("max_turns", num_pages + 4)  # the reads, the answer, and spare
        super().__init__(**kwargs)
        if num_pages < 2 or filler_words < 0:
            raise ValueError(f"voyage: need num_pages >= 2 and filler_words >= 0; got "
                             f"{num_pages}, {filler_words}")
        self.num_pages, self.filler_words = num_pages, filler_words

    @tool
    def next_entry(self) -> str:
        """Read the next entry of the ship's log."""
        pages = self.task.answer["pages"]
        done = sum(1 for m in self.history if m.role == "tool" and m.name == "next_entry")
        return pages[done] if done < len(pages) else "No more entries: reply with your answer."

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Entries of sea-log filler; the port on the first entry, the cargo on the last."""
        port = str(rng.choice(PORTS))
        cargo = str(rng.choice(CARGOES))
        pages = []
        for index in range(self.num_pages):
            lines = [f"Entry {index + 1} of {self.num_pages}.",
                     " ".join(str(w) for w in rng.choice(FILLER, self.filler_words))]
            if index == 0:
                lines.insert(1, f"Port: {port}")
            if index == self.num_pages - 1:
                lines.insert(1, f"Cargo: {cargo}")
                lines.append(LAST)
            pages.append("\n".join(lines))
        question = Message("user", f"The log has {self.num_pages} entries.")
        return Task([Message("system", SYSTEM), question],
                    answer={"port": port, "cargo": cargo, "pages": pages},
                    key=" ".join(pages))

    def grade(self, answer: str) -> Grade:
        """Half for the port after `Port:`, half for the cargo after `Cargo:`;
        ``correct`` needs both."""
        text = answer.split("<answer>")[-1].split("</answer>")[0]
        words = text.lower().replace(".", " ").replace(",", " ").replace(":", " : ").split()
        port = _after(words, "port")
        cargo = _after(words, "cargo")
        right_port = float(port == self.task.answer["port"])
        right_cargo = float(cargo == self.task.answer["cargo"])
        return Grade((right_port + right_cargo) / 2,
                     {"port": right_port, "cargo": right_cargo,
                      "correct": float(right_port and right_cargo)})

    def needed_facts(self) -> list[str]:
        """What a compaction must keep: the port and the cargo, as the entries write them."""
        return [self.task.answer["port"], self.task.answer["cargo"]]

    def demonstrate(self, messages: list[Message]) -> str:
        """Read until the last entry, then answer with the kept port and the cargo."""
        newest = messages[-1]
        if newest.role == "tool" and LAST in newest.content:
            port = _labelled(messages, "Port")[0]
            cargo = _labelled([newest], "Cargo")[-1]
            return f"<answer>Port: {port}. Cargo: {cargo}.</answer>"
        return format_call("next_entry")

    def demonstrate_summary(self, messages: list[Message], forced: bool) -> str | None:
        """Keep the port. Unforced (the compact tool): only right after the entry that
        showed it; forced (the context is full): always."""
        newest = messages[-1]
        if not forced and not (newest.role == "tool" and "Port:" in newest.content):
            return None
        ports = _labelled(messages, "Port")
        return f"Port: {ports[0]}." if ports else "Port: unknown."


def _labelled(messages: list[Message], label: str) -> list[str]:
    """The words after `label:` in the tool results so far, in order."""
    return [line.split()[1] for m in messages if m.role == "tool"
            for line in m.content.splitlines() if line.startswith(f"{label}: ")]


def _after(words: list[str], label: str) -> str | None:
    """The word after `label :` in an answer, or None."""
    for i, word in enumerate(words[:-2]):
        if word == label and words[i + 1] == ":":
            return words[i + 2]
    return None

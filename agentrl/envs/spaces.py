"""The Gymnasium spaces of an ``AgentEnv``: actions are the model's text, observations
lists of chat messages."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from agentrl.types import Message

ROLES = ("system", "user", "assistant", "tool")
_PRINTABLE = tuple(chr(c) for c in range(32, 127)) + ("\n",)


class TextSpace(spaces.Space[str]):
    """Any string up to ``max_length`` characters: the space of the model's actions."""

    def __init__(self, max_length: int = 100_000, seed: int | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Text cannot be flattened into a numeric array."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Random printable text (short), enough for checkers and smoke tests."""
        length = int(self.np_random.integers(1, 40))
        return "".join(self.np_random.choice(_PRINTABLE, size=length))

    def contains(self, x: Any) -> bool:
        """Any str within the length limit."""
        return isinstance(x, str) and len(x) <= self.max_length

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


class MessageSpace(spaces.Space[list[Message]]):
    """Lists of chat messages: the space of observations."""

    def __init__(self, max_messages: int = 1024, max_length: int = 1_000_000,
                 seed: int | None = None):
        self.max_messages = max_messages
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Messages cannot be flattened into a numeric array."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """A few random messages, for checkers."""
        count = int(self.np_random.integers(1, 4))
        text = TextSpace(seed=int(self.np_random.integers(2**31)))
        return [Message(str(self.np_random.choice(ROLES)), text.sample()) for _ in range(count)]

    def contains(self, x: Any) -> bool:
        """A list of Messages with known roles and str content within the limits."""
        return (
            isinstance(x, list)
            and len(x) <= self.max_messages
            and all(
                isinstance(m, Message) and m.role in ROLES and isinstance(m.content, str)
                and len(m.content) <= self.max_length
                for m in x
            )
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageSpace) and (
            (other.max_messages, other.max_length) == (self.max_messages, self.max_length)
        )

"""What a user is told, as a key and its fields: a refusal of their input, or a note of what a
prompt had to drop. The layers that find it say it this way; serve/messages.py holds each key's
text in English and Chinese and renders it at the edge (the page's status line in its language,
an API's error), so nothing ever reads a rendered message back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Message:
    key: str  # a key of serve.messages.TEMPLATES
    fields: tuple[tuple[str, Any], ...] = ()  # (name, value): text, a number, or a Message within it

    @classmethod
    def keyed(cls, key: str, **fields: Any) -> Message:
        return cls(key, tuple(fields.items()))

    def field(self, name: str, default: Any = None) -> Any:
        return dict(self.fields).get(name, default)

    def with_fields(self, **fields: Any) -> Message:
        """The same message with more fields (or these set anew)."""
        return Message(self.key, tuple({**dict(self.fields), **fields}.items()))


class Refusal(ValueError):
    """An input the app does not take: which field and why, as a Message. A ValueError, so that
    callers which catch those still do."""

    def __init__(self, key: str, **fields: Any):
        self.message = Message.keyed(key, **fields)
        super().__init__(self.message)

    @classmethod
    def saying(cls, message: Message) -> Refusal:
        return cls(message.key, **dict(message.fields))

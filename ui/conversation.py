"""Chat's conversation as a record: the persona, and each turn's message with every reply drawn for
it (a retry keeps the one it replaces) and the one shown. Each reply keeps the outcome of the run
that wrote it (seed, the settings changed, the adapter), so that an earlier turn can be drawn again
exactly (Conversation.replayed) and the export carries them; a reply edited by hand keeps an
outcome that says so (Outcome.edited), beside the reply it was edited from. The Chat tab keeps the record in a
gr.State and renders it to the Chatbot (ui/tabs/chat.py); nothing rebuilds it from the page.

As JSON (an export, the browser's copy) the record also gives its shown turns as "history", the
[user, bot] pairs that /chat takes and that older exports held alone: an export can be sent back
through the API as it is, and an older one is read as a conversation of replies without runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from serve import Task
from serve.apis import history_pairs
from serve.messages import Refusal
from serve.outcome import EDITED, Outcome
from serve.running import asked_again, checked_text


@dataclass(frozen=True)
class Reply:
    text: str
    outcome: Outcome | None = None  # the run that wrote it; None: from an older export, which kept none

    def as_json(self) -> dict:
        return {"text": self.text, "outcome": None if self.outcome is None else self.outcome.as_json()}

    @classmethod
    def from_json(cls, data: dict) -> "Reply":
        """A reply as as_json wrote it; an outcome this app cannot read (kept by another version of
        it) is left out, as an older export leaves it, and the text stays."""
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise Refusal("history_pairs")
        try:
            outcome = None if data.get("outcome") is None else Outcome.from_json(data["outcome"])
        except (KeyError, TypeError, ValueError):
            outcome = None
        return cls(data["text"], outcome)


@dataclass(frozen=True)
class Turn:
    user: str
    replies: tuple[Reply, ...]  # at least one: a message the bot has not answered has Reply("")
    shown: int = 0  # which reply the conversation shows (◀ ▶ after a retry)

    @property
    def reply(self) -> Reply:
        return self.replies[self.shown]

    def as_json(self) -> dict:
        return {"user": self.user, "replies": [reply.as_json() for reply in self.replies], "shown": self.shown}

    @classmethod
    def from_json(cls, data: dict) -> "Turn":
        if not (isinstance(data, dict) and isinstance(data.get("user"), str) and isinstance(data.get("replies"), list)
                and data["replies"] and data.get("shown") in range(len(data["replies"]))):
            raise Refusal("history_pairs")
        return cls(data["user"], tuple(map(Reply.from_json, data["replies"])), data["shown"])


@dataclass(frozen=True)
class Conversation:
    persona: str = ""
    turns: tuple[Turn, ...] = ()

    @classmethod
    def from_pairs(cls, persona: str, pairs) -> "Conversation":
        """A conversation from [user, bot] pairs (an older export, /chat's history): one reply a turn."""
        return cls(persona, tuple(Turn(user, (Reply(bot),)) for user, bot in pairs))

    @property
    def pairs(self) -> list[list[str]]:
        """The turns as shown, as [user, bot] pairs: the history /chat takes."""
        return [[turn.user, turn.reply.text] for turn in self.turns]

    def before(self, at: int) -> "Conversation":
        """The conversation before turn `at` (an undo, an edited message)."""
        return replace(self, turns=self.turns[:at])

    def answered(self, at: int, user: str, reply: Reply) -> "Conversation":
        """`reply` to `user` as turn `at`: shown beside the replies kept before where it answers that
        turn again (a retry), a new turn otherwise."""
        if at < len(self.turns) and self.turns[at].user == user:
            replies = (*self.turns[at].replies, reply)
            turn = Turn(user, replies, len(replies) - 1)
        else:
            turn = Turn(user, (reply,))
        return replace(self, turns=(*self.turns[:at], turn))

    def edited(self, at: int, text: str) -> "Conversation":
        """Turn `at`'s shown reply written over by hand (Outcome.edited): beside the reply a run drew,
        which stays to switch back to (◀ ▶ on the last turn), or in place of an earlier edit. The
        turns after it stay; the next prompt reads the edited text."""
        turn = self.turns[at]
        if text == turn.reply.text:  # saved as it was: no edit
            return self
        reply = Reply(text, Outcome.edited())
        if turn.reply.outcome is not None and turn.reply.outcome.kind == EDITED:
            replies = (*turn.replies[:turn.shown], reply, *turn.replies[turn.shown + 1:])
            edited = replace(turn, replies=replies)
        else:
            edited = Turn(turn.user, (*turn.replies, reply), len(turn.replies))
        return replace(self, turns=(*self.turns[:at], edited, *self.turns[at + 1:]))

    def switched(self, step: int) -> "Conversation | None":
        """The last turn showing its previous (step -1) or next (+1) reply, round; None where it has
        no other."""
        if not self.turns or len(self.turns[-1].replies) < 2:
            return None
        last = self.turns[-1]
        return replace(self, turns=(*self.turns[:-1], replace(last, shown=(last.shown + step) % len(last.replies))))

    def replayed(self, at: int, task: Task) -> dict[str, Any] | None:
        """What ran turn `at`'s shown reply: its message after the turns before it, the persona, and
        the seed, settings and adapter its outcome keeps; a request that draws that reply again.
        None for a reply that keeps no run (from an older export, or edited by hand)."""
        turn = self.turns[at]
        if turn.reply.outcome is None or not turn.reply.outcome.ran:
            return None
        return {"message": turn.user, "history": self.before(at).pairs, "persona": self.persona,
                **asked_again(turn.reply.outcome, task)}

    def as_json(self) -> dict:
        return {"persona": self.persona, "history": self.pairs, "turns": [turn.as_json() for turn in self.turns]}

    @classmethod
    def from_json(cls, data: dict) -> "Conversation":
        """A conversation as as_json wrote it, or as an older export did ({"persona", "history"}),
        checked as /chat checks its history and persona: a Refusal (a ValueError) where it is not
        one; a KeyError where it has no history at all."""
        if "turns" not in data:
            conversation = cls.from_pairs("", history_pairs(data["history"]))
        elif isinstance(data["turns"], list):
            conversation = cls("", tuple(map(Turn.from_json, data["turns"])))
            history_pairs(conversation.pairs)
        else:
            raise Refusal("history_pairs")
        return replace(conversation, persona=checked_text("persona", data.get("persona", "")))

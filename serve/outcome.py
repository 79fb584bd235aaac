"""A run's outcome as a record: what ended it (done, refused or fault), the message that says why
it was refused or failed, and what reproduces it (seed, settings that differ, adapter state, steering) with
its counts and notes. Each tab keeps its last outcome in a gr.State; `status_line` renders it, in
the page's language, as the line under the output. Nothing reads the line back: whatever needs to
know how a run ended reads the record.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace

from engine.generate import Result

from .messages import Message, message_of, render

log = logging.getLogger(__name__)

# EDITED: no run at all, a reply the user wrote over by hand (Chat): it has no seed, counts or tokens.
# WITHDRAWN: no run at all either, a request its user stopped while it waited for its turn (serve/admission.py).
DONE, REFUSED, FAULT, EDITED, WITHDRAWN = "done", "refused", "fault", "edited", "withdrawn"
REFUSED_MARK = "⚠️ "  # how the line of a refusal or a fault starts
# Why a run stopped, as its status line says it to a person (Result.stop_reason keeps the code).
STOP_REASON_WORDS = {"eos": "end of text", "stop_string": "stop string", "max_tokens": "max_new_tokens reached",
                     "context_full": "context full", "cancelled": "Stop pressed", "task_done": "answer complete"}
# What a retry of the same request adds to say why its reply is the same (ui/tabs/chat.py).
SAME_SEED, GREEDY_SAME = Message.keyed("same_seed"), Message.keyed("greedy_same")
RETRY_NOTES = {SAME_SEED.key, GREEDY_SAME.key}


@dataclass(frozen=True)
class Outcome:
    kind: str  # DONE, REFUSED, FAULT, EDITED or WITHDRAWN
    message: Message | None = None  # a refusal's or fault's: which field and why
    seed: int | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    tokens_per_second: float | None = None
    stop_reason: str = ""  # STOP_REASON_WORDS's key
    adapter: Message | None = None  # adapter off / on / at a strength / compared; None: the task has none
    # the decoding settings that differ from the task's defaults, and the stop strings added to its own (a tuple)
    changed: tuple[tuple[str, float | tuple[str, ...]], ...] = ()
    notes: tuple[Message, ...] = ()  # what the prompt had to drop, what a run was continued from, ...
    steering: Message | None = None  # serve.running.steering_state; None: not steered

    @classmethod
    def done(cls, result: Result, adapter: Message | None, changed: list[tuple[str, float | tuple[str, ...]]],
             notes: list[Message], steering: Message | None = None) -> "Outcome":
        return cls(DONE, seed=result.seed, prompt_tokens=result.prompt_tokens,
                   generated_tokens=result.generated_tokens, tokens_per_second=result.tokens_per_second,
                   stop_reason=result.stop_reason, adapter=adapter, changed=tuple(changed), notes=tuple(notes),
                   steering=steering)

    @classmethod
    def refused(cls, why: Message | ValueError) -> "Outcome":
        """An input the app does not take; `why` (a message, or the error that refused it) names the
        field and why."""
        return cls(REFUSED, why if isinstance(why, Message) else message_of(why))

    @classmethod
    def fault(cls, where: str, error: BaseException) -> "Outcome":
        """A failure of the app, not of the input: logged, and said without the app's internals."""
        log.error("%s: generation failed: %s: %s", where, type(error).__name__, error)
        return cls(FAULT, Message.keyed("generation_failed", kind=type(error).__name__))

    @classmethod
    def edited(cls) -> "Outcome":
        """A reply edited by hand: what the model is given as its words from then on."""
        return cls(EDITED, Message.keyed("edited_by_hand"))

    @classmethod
    def withdrawn(cls) -> "Outcome":
        """A request stopped while it waited for its turn: nothing was generated, nothing to reproduce."""
        return cls(WITHDRAWN, Message.keyed("stopped_waiting"))

    @property
    def ran(self) -> bool:
        return self.kind == DONE

    def noted(self, note: Message) -> "Outcome":
        return replace(self, notes=(*self.notes, note))

    def as_json(self) -> dict:
        """The record as JSON values, for a front end on another machine (serve/cluster.py)."""
        return asdict(self)  # (a Message, also one within another's fields, becomes {"key", "fields"})

    @classmethod
    def from_json(cls, data: dict) -> "Outcome":
        def message(value) -> Message | None:
            return None if value is None else message_from_json(value)
        return cls(**{**data, "message": message(data["message"]), "adapter": message(data["adapter"]),
                      "steering": message(data.get("steering")),  # (a record kept before steering has none)
                      "changed": tuple((name, tuple(value) if isinstance(value, list) else value)
                                       for name, value in data["changed"]),
                      "notes": tuple(map(message, data["notes"]))})

    def reproduces(self, other: "Outcome | None") -> bool:
        """Whether both are runs of the same request (seed, settings, counts, why they stopped),
        whatever their speed and the notes a retry adds (RETRY_NOTES)."""
        if other is None or not (self.ran and other.ran):
            return False
        def run_of(outcome: Outcome) -> tuple:
            notes = tuple(note for note in outcome.notes if note.key not in RETRY_NOTES)
            return (outcome.seed, outcome.prompt_tokens, outcome.generated_tokens, outcome.stop_reason,
                    outcome.adapter, outcome.changed, outcome.steering, notes)
        return run_of(self) == run_of(other)


def message_from_json(data: dict) -> Message:
    """A Message from its JSON form ({"key", "fields": [[name, value], ...]}), a message within it
    too; a ValueError where this app cannot say it (a record kept by an older one, say)."""
    def value_of(value):
        return message_from_json(value) if isinstance(value, dict) else value
    message = Message(data["key"], tuple((name, value_of(value)) for name, value in data["fields"]))
    try:
        render(message, "en")
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"a message this app cannot say: {data!r}") from error
    return message


def status_line(outcome: Outcome | None, lang: str) -> str:
    """The line under a tab's output for `outcome` (None: no run yet), in `lang`: how to reproduce
    the run (seed, counts, speed, why it stopped, the adapter, the steering, the settings changed) and its notes;
    or, marked, why it was refused or failed; or that the reply was edited by hand, or the request
    stopped before its turn came."""
    if outcome is None:
        return ""
    if outcome.kind in (EDITED, WITHDRAWN):  # no run, and nothing wrong with it either
        return render(outcome.message, lang)
    if not outcome.ran:
        return REFUSED_MARK + render(outcome.message, lang)
    speed = f"{outcome.tokens_per_second:.1f}" if outcome.tokens_per_second else "—"  # none drawn: no speed
    summary = Message.keyed("status", seed=outcome.seed, prompt=outcome.prompt_tokens,
                            generated=outcome.generated_tokens, speed=speed,
                            reason=STOP_REASON_WORDS[outcome.stop_reason])
    changed = [Message.keyed("changed_settings", settings=outcome.changed)] if outcome.changed else []
    steering = [outcome.steering] if outcome.steering else []
    parts = [summary, *([outcome.adapter] if outcome.adapter else []), *steering, *changed, *outcome.notes]
    return " · ".join(render(part, lang) for part in parts)


def english_status(outcome: Outcome | None) -> str:
    """The status line as the API gives it."""
    return status_line(outcome, "en")

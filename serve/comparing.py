"""A comparison: one request run twice at once under one seed, the two sides differing in the one
thing the request names in `compare`:

    "adapter"                 the task's adapter off, then on
    "steering"                the request's steering off, then on (it must ask for one)
    "model:<id>"              the model served, then <id>, one of the host's models (each with its
                              own tokenizer and its own batch)
    "setting:<name>=<value>"  the request's decoding settings, then the same with <name> at <value>

Each side is a whole request of its own (`side_requests`: the request with what that side changes),
so a host runs both through the one path it runs every request on, and a token of either side can
be continued from with that side's request. Everything else is the same, the seed too: both sides
draw the same random numbers at every step, so where nothing really differs (the same model twice,
top_k 0 against top_k 0) the two are the same bit for bit.

The outcome is a `Comparison` record: each side's label, tokens, prompt and outcome (its speed),
each side's tokens scored under the other where both share a tokenizer, and the first difference:
a token index where they share a tokenizer, and by text where they do not (the first character
where the texts part, and the token of each side that holds it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from tasks import TaskDone

from .limits import INTEGER_SETTINGS, brief, check_setting, check_temperature
from .messages import Message, Refusal, english
from .outcome import Outcome, english_status, message_from_json
from .running import SETTING_RANGES, SETTINGS, adapter_state, public_logprobs

ADAPTER, STEERING, MODEL, SETTING = "adapter", "steering", "model", "setting"
FORMS = "adapter, steering, model:<id>, setting:<name>=<value>"  # what `compare` may say
# The settings a comparison may set apart: the numeric decoding settings.
COMPARED_SETTINGS = tuple(name for name, kind in SETTINGS if kind in (int, float))
STEERING_FIELDS = "steer_strength, steer_positive, steer_negative"


@dataclass(frozen=True)
class Axis:
    """What differs between the two sides: `kind` (ADAPTER, STEERING, MODEL or SETTING), the model
    or setting it names, and the setting's value on the second side."""
    kind: str
    name: str | None = None
    value: float | None = None

    @property
    def spelled(self) -> str:
        """As `compare` says it."""
        if self.kind == MODEL:
            return f"{MODEL}:{self.name}"
        return f"{SETTING}:{self.name}={self.value:g}" if self.kind == SETTING else self.kind


def parse_compare(compare: Any, models: Sequence[str]) -> Axis:
    """The axis `compare` names (see the module's docstring), `models` being those a model
    comparison may name; a Refusal naming the field `compare` and why."""
    if not isinstance(compare, str):
        raise Refusal("one_of", name="compare", choices=FORMS, value=brief(compare))
    kind, colon, rest = compare.strip().partition(":")
    rest = rest.strip()
    if kind in (ADAPTER, STEERING) and not colon:
        return Axis(kind)
    if kind == MODEL and rest:
        if rest not in models:
            raise Refusal("compare_model", name="compare", model=rest, names=", ".join(models))
        return Axis(MODEL, rest)
    name, equals, value = rest.partition("=")
    if kind == SETTING and equals:
        return compared_setting(name, value)
    raise Refusal("one_of", name="compare", choices=FORMS, value=brief(compare))


def compared_setting(name: str, value: str) -> Axis:
    """The axis of "setting:<name>=<value>", the value checked as the setting's own range checks it."""
    name = name.strip()
    if name not in COMPARED_SETTINGS:
        raise Refusal("compare_setting", name="compare", setting=name, names=", ".join(COMPARED_SETTINGS))
    try:
        number = check_setting(name, number_in(value), *SETTING_RANGES[name], integer=name in INTEGER_SETTINGS)
        if name == "temperature":
            check_temperature(number)
    except Refusal as refused:
        raise Refusal("compare_value", name="compare", error=refused.message) from None
    return Axis(SETTING, name, number)


def number_in(text: str) -> Any:
    """The number `text` spells (an int where it is one), or the text itself, for check_setting to refuse."""
    for kind in (int, float):
        try:
            return kind(text.strip())
        except ValueError:
            continue
    return text.strip()


def side_requests(axis: Axis, values: dict[str, Any], served: str) -> tuple[dict, dict]:
    """What each side changes of the request `values` (on the model `served` unless it names
    another): the two requests are the request with each of these."""
    if axis.kind == ADAPTER:
        return {"adapter": False}, {"adapter": True}
    if axis.kind == STEERING:
        return {"steer_strength": 0.0}, {}
    if axis.kind == MODEL:
        return {"model": values.get("model") or served}, {"model": axis.name}
    return {}, {axis.name: axis.value}


def no_steering() -> Refusal:
    """A steering comparison of a request that asks for no steering: both sides would be the same."""
    return Refusal("compare_no_steering", fields=STEERING_FIELDS)


def side_labels(axis: Axis, sides: Sequence[Any]) -> tuple[Message, Message]:
    """What each side is called (`sides`: each side's request made ready, with its params, adapter
    and model: serve/model_host.py's Prepared)."""
    if axis.kind == ADAPTER:
        return tuple(adapter_state(side.adapter, side.params.adapter_scale) for side in sides)
    if axis.kind == STEERING:
        return Message.keyed("steering_off"), Message.keyed("steering_on")
    if axis.kind == MODEL:
        return tuple(Message.keyed("model_side", model=side.model) for side in sides)
    return tuple(Message.keyed("setting_side", setting=axis.name, value=getattr(side.params, axis.name))
                 for side in sides)


def shown_side(axis: Axis, values: dict[str, Any]) -> int:
    """The side a run without Compare would have given, which the output box shows: the adapter as
    its switch says; steered (the request asks for it); the model served; the settings as set."""
    if axis.kind == ADAPTER:
        return int(values.get("adapter") is True)
    return 1 if axis.kind == STEERING else 0


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending first counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_difference_by_text(a: list[dict], b: list[dict]) -> tuple[int | None, tuple[int | None, int | None]]:
    """Where two runs' tokens (Result.logprobs, of two tokenizers) part by text: the first character
    where their texts (the tokens' bytes joined) differ, and the token of each side that starts it
    (one past the last where a side ends there); (None, (None, None)) where the texts are the same."""
    texts = [b"".join(bytes(entry["bytes"]) for entry in side) for side in (a, b)]
    if texts[0] == texts[1]:
        return None, (None, None)
    common = next((i for i, (x, y) in enumerate(zip(*texts)) if x != y), min(map(len, texts)))
    before = texts[0][:common].decode("utf-8", errors="ignore")  # a character cut short is the one that differs
    start = len(before.encode())
    return len(before), (token_at(a, start), token_at(b, start))


def token_at(entries: list[dict], offset: int) -> int:
    """The index of the token whose bytes hold byte `offset` of the tokens' text (len(entries) past it)."""
    end = 0
    for i, entry in enumerate(entries):
        end += len(entry["bytes"])
        if offset < end:
            return i
    return len(entries)


@dataclass(frozen=True)
class Comparison:
    """A comparison's outcome beside the shown side's own (which the status line gives): for each
    side, its label, what it changed of the request, its tokens with their alternatives, the same
    tokens' log-probabilities under the other side (None: the tokenizers differ), its prompt and
    its outcome; the first token where they part on each side, and, where the tokenizers differ
    (by_text), the character of the text where they do."""
    axis: str  # as `compare` said it (Axis.spelled)
    labels: tuple[Message, Message]
    asked: tuple[dict, dict]  # side_requests: each side's request is the request with this
    shown: int  # the side in the output box (shown_side)
    entries: tuple[list, list]
    under_other: tuple[list | None, list | None]
    prompts: tuple[str, str]
    outcomes: tuple[Outcome, Outcome]
    diverges_at: tuple[int | None, int | None]
    by_text: bool = False
    character: int | None = None

    @classmethod
    def of(cls, axis: Axis, labels, asked, shown: int, done: Sequence[TaskDone], outcomes, under_other,
           same_tokenizer: bool) -> "Comparison":
        entries = tuple(side.result.logprobs for side in done)
        if same_tokenizer:
            at = first_difference(*([entry["id"] for entry in side] for side in entries))
            character, diverges_at = None, (at, at)
        else:
            character, diverges_at = first_difference_by_text(*entries)
        return cls(axis.spelled, tuple(labels), tuple(asked), shown, entries, tuple(under_other),
                   tuple(side.prompt.text for side in done), tuple(outcomes), diverges_at, not same_tokenizer,
                   character)

    @property
    def same(self) -> bool:
        return self.diverges_at == (None, None)

    def as_json(self) -> dict:
        """As JSON values, for a page in front of replicas (serve/page_api.py)."""
        return {**asdict(self), "outcomes": [outcome.as_json() for outcome in self.outcomes]}

    @classmethod
    def from_json(cls, data: dict) -> "Comparison":
        pairs = {name: tuple(data[name]) for name in ("asked", "entries", "under_other", "prompts", "diverges_at")}
        return cls(**{**data, **pairs, "labels": tuple(map(message_from_json, data["labels"])),
                      "outcomes": tuple(map(Outcome.from_json, data["outcomes"]))})


def compared_outcome(comparison: Comparison) -> Outcome:
    """The comparison's status: the shown side's outcome, noted as compared with the other (both
    labels), with the notes only the other side made marked as its own (the English a French ->
    German run went through, the example pairs it dropped to fit)."""
    shown, other = comparison.shown, 1 - comparison.shown
    labels, outcomes = comparison.labels, comparison.outcomes
    outcome = outcomes[shown].noted(Message.keyed("compared_sides", a=labels[0], b=labels[1], shown=labels[shown]))
    for note in outcomes[other].notes:
        if note not in outcomes[shown].notes:
            outcome = outcome.noted(Message.keyed("side_note", side=labels[other], note=note))
    return outcome


def side_outcome(comparison: Comparison, side: int) -> Outcome:
    """One side's own outcome, noted as that side of the comparison: a reply kept from it (Chat) says
    where it came from."""
    return comparison.outcomes[side].noted(Message.keyed("compared_side", side=comparison.labels[side]))


def public_comparison(texts: Sequence[str], outcome: Outcome, comparison: Comparison) -> dict:
    """A finished comparison as the API gives it: each side's label, text, tokens (with their
    log-probabilities and alternatives, and under the other side where the tokenizers agree), status
    line (its counts and speed) and first differing token; the first difference (always a token index
    of the first side, or None, so that a client reads one type; across tokenizers also the
    character where the texts part), and the status line of the side shown."""
    def side(i: int) -> dict:
        return {"label": english(comparison.labels[i]), "text": texts[i],
                "logprobs": public_logprobs(comparison.entries[i]), "under_other": comparison.under_other[i],
                "status": english_status(comparison.outcomes[i]), "first_difference": comparison.diverges_at[i]}
    return {"compare": comparison.axis, "sides": [side(0), side(1)], "first_difference": comparison.diverges_at[0],
            "by_text": comparison.by_text, "first_difference_character": comparison.character,
            "shown": comparison.shown, "status": english_status(outcome)}

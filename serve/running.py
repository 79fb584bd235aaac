"""What every host runs a task with (serve/host.py): the API's parameters and the request's
limits, its decoding settings, the outcome of a run, the pace of its updates, and Stop. A host on
this machine (model_host.py) and one in front of replicas (backend.py) both use these, so a run
is checked, described and stopped the same way wherever it decodes.
"""
from __future__ import annotations

import inspect
import math
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from engine.generate import SamplingParams, resolve_seed
from model import GPT2Config
from tasks import Task, TaskDone

from .inspection import Inspection, LogitLens
from .limits import LIMITS, added_stops, brief, check_setting, checked_params
from .messages import Message, Refusal
from .outcome import Outcome

REQUIRED = inspect.Parameter.empty
# What a request may hold beside its endpoint's parameters, read by the host itself: what a
# comparison sets apart (serve/comparing.py), the model a side of one ran on, the tokens a run
# continued from a chosen token starts with, the record of a vector file the page imported (steer_file).
HOST_VALUES = ("compare", "model", "forced", "steer_file")

# What one request may send. The context window bounds what a model reads, but text is tokenized
# (and a conversation or example list walked) before it is cut to fit, so these bound that work
# and the size of what the app echoes back. The fields that make up most of a prompt allow more
# than GPT-2's 1024-token context holds (some 4 characters a token); a persona is one line.
MAX_CHARS = {"prompt": 20_000, "article": 50_000, "message": 4_000, "persona": 1_000, "history": 100_000,
             "text": 4_000, "source": 20, "target": 20, "examples": 20_000, "steer_positive": 4_000,
             "steer_negative": 4_000, "stop": 2_000}
SAID_AS = {"text": "text to translate", "clean": "clean prompt", "corrupted": "corrupted prompt",
           "noise_span": "noise span"}  # a field a message names as the tab does, not by its bare API name
MAX_CHAT_TURNS = 200  # [user, bot] pairs in a /chat history
MAX_EXAMPLE_PAIRS = 64  # `source = target` lines in /translate's examples
MAX_STEER_PAIRS = 32  # positive/negative lines of a steering: a forward pass each, before the run starts
MAX_FILE_NAME = 1_000  # a steering vector file's name and hash, as a run names them
DIGEST_SHOWN = 12  # the hex digits of a steering vector file's sha256 that the status line gives
# The most tokens one request may generate: a request holds a row of the decode batch until it
# is done, so this bounds how long one user can hold it.
MAX_NEW_TOKENS = 512
# How often a request's text is sent while it streams (Pacer). Each update costs the server some
# milliseconds of Gradio's work (a thread hop, the output's diff, an event to the client), more
# than a decode step of the bundled model, so an update per token took about half the app's
# streaming speed (docs/performance.md, "Streaming through the app"). text-generation-webui has
# the same cap as a setting, "Maximum UI updates/second", 12 in some of its versions.
MAX_UPDATES_PER_SECOND = 12
TOP_SHOWN = 10  # the alternatives a token offers in the page (the API's logprobs reach 20)
SETTING_RANGES = {**LIMITS, "max_new_tokens": (1, MAX_NEW_TOKENS)}  # what the app takes; the sliders span it


class Pacer:
    """When an update may go: the first at once, then at most `per_second` a second (math.inf:
    every one). Text held back goes with the next update, when the next text arrives (a token
    after a stall: another request's prompt going in, say) or the run ends."""

    def __init__(self, per_second: float):
        self.interval, self.last = 1 / per_second, -math.inf

    def due(self, now: float) -> bool:
        if now - self.last < self.interval:
            return False
        self.last = now
        return True


@dataclass(frozen=True)
class Param:
    """One named parameter of an API endpoint."""
    name: str
    type: Any  # the annotation gradio_client documents
    default: Any = REQUIRED


# The decoding settings every task takes, after its own parameters, in this order.
SETTINGS = (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float), ("typical_p", float),
            ("repetition_penalty", float), ("presence_penalty", float), ("frequency_penalty", float),
            ("no_repeat_ngram_size", int), ("max_new_tokens", int))
RANDOM_SEED = -1  # as well as None: what the UI's empty seed box sends
# Stop strings besides the task's own, which every task takes after SETTINGS: text, one a line
# (stop_lines), or a list of strings; none by default.
STOP_PARAM = Param("stop", str | list[str], "")
# What a backslash and the character after it stand for on a line of stop strings: a line end or a
# tab cannot be typed on a line of a text box; a doubled backslash is one, where it comes before
# an n or a t that are meant as letters.
STOP_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def asks_random_seed(seed: Any) -> bool:
    return seed is None or seed == RANDOM_SEED


def drawn_seed(seed: Any) -> Any:
    """The seed a run goes with: a new random one where the caller asks for one (None or -1), so
    that whoever starts the run knows it; otherwise the caller's, as given (checked later)."""
    return resolve_seed(None) if asks_random_seed(seed) else seed


# Steering, which every task takes last (steering_asked): the i-th lines of the positive and
# negative texts form a pair; the layer None is the loaded model's middle; strength 0 is off. (The
# page and /studio may send a vector file's record too, steer_file: not an API parameter.)
STEERING_PARAMS = (Param("steer_positive", str, ""), Param("steer_negative", str, ""),
                   Param("steer_layer", int | None, None), Param("steer_strength", float, 0.0))


def setting_params(task: Task) -> list[Param]:
    """The settings, seed, (for a task that has an adapter) the adapter switch and steering as
    API parameters, defaulting to the task's own."""
    defaults = task.defaults
    adapter = [] if task.adapter is None else [Param("adapter", bool, False),
                                               Param("adapter_scale", float, defaults.adapter_scale)]
    return ([Param(name, kind, getattr(defaults, name)) for name, kind in SETTINGS]
            + [STOP_PARAM, Param("seed", int | None, None), *adapter, Param("logprobs", int, defaults.logprobs),
               *STEERING_PARAMS])


@dataclass(frozen=True)
class SteeringAsked:
    """The steering a request asks for, checked: its pairs of lines, layer and strength; or, with a
    vector file's (steer_file), that file's vector, name and hash, the lines then only its texts."""
    positive: tuple[str, ...]
    negative: tuple[str, ...]
    layer: int
    strength: float
    vector: tuple[float, ...] | None = None  # a file's, in place of the lines' (serve/vectors.py)
    file: str = ""
    sha256: str = ""


def steering_lines(text: str) -> tuple[str, ...]:
    """A steering text's lines with text on them, stripped: the halves of its pairs."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def steering_asked(values: dict[str, Any], config: GPT2Config) -> SteeringAsked | None:
    """The request's steering (STEERING_PARAMS, and a vector file's steer_file; missing ones are
    their defaults), checked, or None where it asks for none: strength 0, or no texts and no file.
    A Refusal names the field."""
    positive = steering_lines(checked_text("steer_positive", values.get("steer_positive", "")))
    negative = steering_lines(checked_text("steer_negative", values.get("steer_negative", "")))
    strength = check_setting("steer_strength", values.get("steer_strength", 0.0), *LIMITS["steer_strength"])
    file = steer_file_asked(values.get("steer_file"), config.n_embd)
    if strength == 0 or not (positive or negative or file):
        return None
    if file is None and len(positive) != len(negative):
        raise Refusal("steer_pairs", positive=len(positive), negative=len(negative))
    check_count("steering pairs", len(positive), MAX_STEER_PAIRS)
    layer = values.get("steer_layer")
    n_layer = config.n_layer
    layer = n_layer // 2 if layer is None else check_setting("steer_layer", layer, 0, n_layer, integer=True)
    return SteeringAsked(positive, negative, layer, strength, **(file or {}))


def steer_file_asked(record: Any, n_embd: int) -> dict[str, Any] | None:
    """A vector file's record as a run takes it (steer_file: {"name", "sha256", "vector"}, from
    serve/vectors.py), checked, as SteeringAsked's fields; None where the run has none."""
    if record is None:
        return None
    if not (isinstance(record, dict) and isinstance(record.get("name"), str)
            and isinstance(record.get("sha256"), str) and isinstance(record.get("vector"), list)):
        raise Refusal("steer_file_record", name="steer_file", width=n_embd)
    check_size("steer_file", len(record["name"]) + len(record["sha256"]), MAX_FILE_NAME)
    vector = record["vector"]
    if len(vector) != n_embd:  # another model's: one of another width
        raise Refusal("steer_vector_width", file=record["name"], width=len(vector), n_embd=n_embd)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
        raise Refusal("steer_file_record", name="steer_file", width=n_embd)
    return {"vector": tuple(map(float, vector)), "file": record["name"], "sha256": record["sha256"]}


def steering_state(asked: SteeringAsked, norm: float | None = None, typical: float | None = None) -> Message:
    """The status part that names a run's steering: its layer and strength, its pairs or its file
    (name and hash), the vector's norm beside the residual's there (what a strength means; None:
    not measured, as for a run stopped on a replica), and what reproduces it (asked_again): the
    texts, and a file's vector."""
    measured = {} if norm is None else {"norm": norm, "typical": typical}
    texts = {"positive": "\n".join(asked.positive), "negative": "\n".join(asked.negative)}
    if asked.vector is None:
        return Message.keyed("steered" if measured else "steered_asked", layer=asked.layer, strength=asked.strength,
                             pairs=len(asked.positive), **measured, **texts)
    return Message.keyed("steered_file" if measured else "steered_file_asked", layer=asked.layer,
                         strength=asked.strength, file=asked.file, digest=asked.sha256[:DIGEST_SHOWN], **measured,
                         **texts, sha256=asked.sha256, vector=list(asked.vector))


def stop_lines(text: str) -> tuple[str, ...]:
    """Stop strings written one a line, as the tabs' box and the API's text take them: every line
    that is not empty, as it is (spaces too), with the escapes STOP_ESCAPES reads (a backslash
    before any other character stays as it is)."""
    return tuple(re.sub(r"\\([nt\\])", lambda escape: STOP_ESCAPES[escape[1]], line)
                 for line in text.splitlines() if line)


def asked_stops(value: Any) -> tuple[str, ...]:
    """The request's `stop` (STOP_PARAM): text, one a line (stop_lines), or a list of strings, each
    as it is; a Refusal naming `stop` where it is neither."""
    if isinstance(value, str):
        return stop_lines(checked_text("stop", value))
    if isinstance(value, (list, tuple)):
        return tuple(value)  # (added_stops checks each)
    raise Refusal("stop_kind", name="stop", kind=type(value).__name__)


def request_stops(task: Task, values: dict[str, Any]) -> tuple[str, ...]:
    """The task's own stop strings, then those the request adds (checked: added_stops), as a run's
    params hold them; the line end an adapter adds (Task.stops) counts in the limit."""
    own = task.stops(bool(values.get("adapter", False)))
    return task.defaults.stop + added_stops(asked_stops(values.get("stop", STOP_PARAM.default)), own)


def sampling_params(task: Task, values: dict[str, Any]) -> SamplingParams:
    """The task's defaults with the caller's settings, each checked against its range, its stop
    strings with the request's (request_stops), and max_new_tokens held to this app's cap."""
    seed = values["seed"]
    if not asks_random_seed(seed):
        try:
            check_setting("seed", seed, *SETTING_RANGES["seed"], integer=True)
        except Refusal as error:  # check_setting's own message knows nothing of the app's -1
            raise Refusal("random_seed", error=error.message) from None
    check_setting("max_new_tokens", values["max_new_tokens"], *SETTING_RANGES["max_new_tokens"], integer=True)
    settings = {name: values[name] for name, _ in SETTINGS}
    params = checked_params(task.defaults, **settings, seed=None if asks_random_seed(seed) else seed,
                            adapter_scale=values.get("adapter_scale", task.defaults.adapter_scale),
                            logprobs=values.get("logprobs", task.defaults.logprobs))
    return replace(params, stop=request_stops(task, values))


def check_settings(task: Task, settings: dict[str, Any]) -> None:
    """Decoding settings kept apart from a run (a preset, ui/presets.py): a Refusal naming the first
    that a run with them would refuse, as sampling_params checks it (the others take the task's
    defaults; a setting it does not check is left to the run)."""
    sampling_params(task, {**{name: getattr(task.defaults, name) for name, _ in SETTINGS}, **settings, "seed": None})


def checked_text(name: str, value: Any, limit: int | None = None) -> str:
    """A text field as it came in (any unicode at all), or a Refusal naming the field and, for
    text longer than `limit` (None: the task field's MAX_CHARS), the limit."""
    said = SAID_AS.get(name, name)
    if not isinstance(value, str):
        raise Refusal("not_text", name=said, kind=type(value).__name__)
    check_size(said, len(value), MAX_CHARS[name] if limit is None else limit)
    return value


def check_size(name: str, characters: int, limit: int) -> None:
    """Refuse a text longer than the app serves, before any work on it."""
    if characters > limit:
        raise Refusal("too_big", name=name, size=characters, limit=limit)


def check_count(what: str, count: int, limit: int) -> None:
    """Refuse a list longer than the app serves ("too many example pairs: 70; the limit is 64"),
    before any work on it."""
    if count > limit:
        raise Refusal("too_many", what=what, count=count, limit=limit)


def outcome_of(done: TaskDone, task: Task, params: SamplingParams, adapter: Message,
               steering: Message | None = None) -> Outcome:
    """How to reproduce the run (seed, token counts, speed, why it stopped; `adapter`, where the
    task has one: adapter_state, since the prompt and output differ with it; the settings changed from the task's defaults, which the seed alone does not
    give back; the steering, steering_state) and what was cut."""
    return Outcome.done(done.result, None if task.adapter is None else adapter,
                        changed_settings(params, task.defaults), done.prompt.notes, steering)


def changed_settings(params: SamplingParams, defaults: SamplingParams) -> list[tuple[str, float | tuple[str, ...]]]:
    """Each decoding setting that differs from the task's default, with its value; and the stop
    strings the request added to the task's own, as a tuple (`stop` as asked_again sends it)."""
    changed = [(name, getattr(params, name)) for name, _ in SETTINGS
               if getattr(params, name) != getattr(defaults, name)]
    added = tuple(stop for stop in params.stop if stop not in defaults.stop)
    return changed + ([(STOP_PARAM.name, added)] if added else [])


def adapter_state(adapter_on: bool, adapter_scale: float) -> Message:
    if not adapter_on:
        return ADAPTER_OFF
    return ADAPTER_ON if adapter_scale == 1 else Message.keyed("adapter_on_scaled", scale=adapter_scale)


ADAPTER_OFF, ADAPTER_ON = Message.keyed("adapter_off"), Message.keyed("adapter_on")


def asked_again(outcome: Outcome, task: Task) -> dict[str, Any]:
    """The settings, seed and adapter switch that ran `outcome`'s run, as a request gives them: the
    task's defaults with the settings it changed, and the adapter as its state says (adapter_state;
    a comparison's, the side shown). Sent again with the same inputs, they draw the same text."""
    state = outcome.adapter
    adapter = {} if state is None else {  # None: the task has no adapter to switch on
        "adapter": state.key in (ADAPTER_ON.key, "adapter_on_scaled"), "adapter_scale": state.field("scale", 1.0)}
    steered = outcome.steering
    steering = {"steer_strength": 0.0} if steered is None else {
        "steer_positive": steered.field("positive"), "steer_negative": steered.field("negative"),
        "steer_layer": steered.field("layer"), "steer_strength": steered.field("strength"),
        "steer_file": None if steered.field("vector") is None else {
            "name": steered.field("file"), "sha256": steered.field("sha256"), "vector": steered.field("vector")}}
    return {**{name: getattr(task.defaults, name) for name, _ in SETTINGS}, STOP_PARAM.name: (),
            **dict(outcome.changed), "seed": outcome.seed, **adapter, **steering}


@dataclass(frozen=True)
class TaskAPI:
    """What a task takes through the API: its own parameters, and how they become its inputs."""
    task: Task
    name: str  # the api_name
    params: tuple[Param, ...]
    make_inputs: Callable[..., Any]  # the task's own parameters, by name -> task.inputs
    description: str

    @property
    def signature(self) -> inspect.Signature:
        params = [*self.params, *setting_params(self.task)]
        return inspect.Signature([inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    default=p.default, annotation=p.type) for p in params],
                                 return_annotation=tuple[str, str, str, list])

    def request(self, values: Any) -> dict[str, Any]:
        """`values`, this endpoint's parameters by name (and any of HOST_VALUES), with the defaults
        of those it leaves out: a request as the endpoint itself would have it. A Refusal names a
        parameter it does not take, or a required one it lacks."""
        if not isinstance(values, dict):
            raise Refusal("values_object", name="values", api=f"/{self.name}", kind=type(values).__name__)
        parameters = self.signature.parameters
        unknown = [name for name in values if name not in parameters and name not in HOST_VALUES]
        if unknown:
            raise Refusal("unknown_parameter", name=brief(unknown[0]), api=f"/{self.name}", names=", ".join(parameters))
        missing = [name for name, p in parameters.items() if p.default is REQUIRED and name not in values]
        if missing:
            raise Refusal("missing_parameter", name=missing[0], api=f"/{self.name}")
        return {**{name: p.default for name, p in parameters.items() if p.default is not REQUIRED}, **values}


def checked_slider(name: str, value: Any, low: int, high: int) -> int:
    """A slider's value as an int from low to high, or a ValueError naming it. A number past an
    end is held to that end: the sliders were sized for the model served when the page loaded,
    and another may be served now; and Gradio's slider holds a number typed below its minimum as
    its box loses focus, so holding it here too draws what the box then shows."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        value = min(max(value, low), high)
    return check_setting(name, value, low, high, integer=True)


@dataclass(frozen=True)
class LiveView:
    """The Architecture tab's look inside a prompt, on the model that ran it."""
    model: str  # its name
    layers: int
    heads: int
    seen: Inspection  # what each layer and the chosen head do
    lens: LogitLens


def public_logprobs(entries: list[dict]) -> list[dict]:
    """Result.logprobs as the API gives them: {"token", "bytes", "logprob", "top": [{"token",
    "bytes", "logprob"}]}; the ids are the app's own (they name the alternative to continue from)."""
    def public(entry: dict) -> dict:
        return {"token": entry["token"], "bytes": entry["bytes"], "logprob": entry["logprob"]}
    return [{**public(e), "top": [public(t) for t in e["top"]]} for e in entries]


@dataclass
class Running:
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)


class StopSwitches:
    """The cancel event of each browser request in flight, by session and tab, so that a tab's
    Stop button reaches its own request and nobody else's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], Running] = {}

    @contextmanager
    def running(self, session: str, tab: str) -> Iterator[threading.Event]:
        key, request = (session, tab), Running()
        with self._lock:
            self._running[key] = request
        try:
            yield request.cancel
        finally:
            with self._lock:
                if self._running.get(key) is request:
                    del self._running[key]
            request.finished.set()

    def stop(self, session: str, tab: str, wait_s: float) -> None:
        """Ask the request to stop, and wait until it has shown its last update (the partial
        text and a status that says "Stop pressed"), at most wait_s seconds."""
        with self._lock:
            request = self._running.get((session, tab))
        if request is not None:
            request.cancel.set()
            request.finished.wait(wait_s)

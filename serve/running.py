"""Running a task for the UI and the API: decoding settings, limits, one streaming loop, and Stop.

Both the browser and `gradio_client` end up in `run`, which takes plain values and yields
(text so far, outcome, prompt sent, logprobs), at most MAX_UPDATES_PER_SECOND times a second,
ending with the run's outcome record (serve/outcome.py). Bad input of any kind ends it refused, with
the message that names the field and the limit, so the caller sees why and the app keeps
serving (the Gradio API answers it as an error: ui/api.py); a generation that fails, or is cancelled, or whose
client leaves, frees its decoding row and is logged in one line.
"""
from __future__ import annotations

import inspect
import logging
import math
import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from engine.generate import SamplingParams, new_token_budget, resolve_seed, score_tokens
from engine.scheduler import in_thread_of_its_own
from model.adapters import check_adapter
from tasks import TASKS, SummarizeInputs, Task, TaskDone, run_task

from .inspection import Inspection, LogitLens, inspect_prompt, logit_lens
from .limits import LIMITS, brief, check_setting, checked_params
from .model_host import LoadedModel, ModelHost
from .outcome import Outcome

REQUIRED = inspect.Parameter.empty
log = logging.getLogger(__name__)

# What one request may send. The context window bounds what a model reads, but text is tokenized
# (and a conversation or example list walked) before it is cut to fit, so these bound that work
# and the size of what the app echoes back. The fields that make up most of a prompt allow more
# than GPT-2's 1024-token context holds (some 4 characters a token); a persona is one line.
MAX_CHARS = {"prompt": 20_000, "article": 50_000, "message": 4_000, "persona": 1_000, "history": 100_000,
             "text": 4_000, "source": 20, "target": 20, "examples": 20_000}
SAID_AS = {"text": "text to translate"}  # a field a message names as the tab does, not by its bare API name
MAX_CHAT_TURNS = 200  # [user, bot] pairs in a /chat history
MAX_EXAMPLE_PAIRS = 64  # `source = target` lines in /translate's examples
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
    """When an update may go: the first at once, then at most `per_second` a second. Text held
    back goes with the next update, when the next text arrives (a token after a stall: another
    request's prompt going in, say) or the run ends."""

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
            ("repetition_penalty", float), ("no_repeat_ngram_size", int), ("max_new_tokens", int))
RANDOM_SEED = -1  # as well as None: what the UI's empty seed box sends


def asks_random_seed(seed: Any) -> bool:
    return seed is None or seed == RANDOM_SEED


def drawn_seed(seed: Any) -> Any:
    """The seed a run goes with: a new random one where the caller asks for one (None or -1), so
    that whoever starts the run knows it; otherwise the caller's, as given (checked later)."""
    return resolve_seed(None) if asks_random_seed(seed) else seed


def setting_params(task: Task) -> list[Param]:
    """The settings, seed and (for a task that has an adapter) the adapter switch as API
    parameters, defaulting to the task's own."""
    defaults = task.defaults
    adapter = [] if task.adapter is None else [Param("adapter", bool, False),
                                               Param("adapter_scale", float, defaults.adapter_scale)]
    return ([Param(name, kind, getattr(defaults, name)) for name, kind in SETTINGS]
            + [Param("seed", int | None, None), *adapter, Param("logprobs", int, defaults.logprobs)])


def sampling_params(task: Task, values: dict[str, Any]) -> SamplingParams:
    """The task's defaults with the caller's settings, each checked against its range, and
    max_new_tokens held to this app's cap."""
    seed = values["seed"]
    if not asks_random_seed(seed):
        try:
            check_setting("seed", seed, *SETTING_RANGES["seed"], integer=True)
        except ValueError as error:  # check_setting's own message knows nothing of the app's -1
            raise ValueError(f"{error}; {RANDOM_SEED} draws a random seed") from None
    check_setting("max_new_tokens", values["max_new_tokens"], *SETTING_RANGES["max_new_tokens"], integer=True)
    settings = {name: values[name] for name, _ in SETTINGS}
    return checked_params(task.defaults, **settings, seed=None if asks_random_seed(seed) else seed,
                          adapter_scale=values.get("adapter_scale", task.defaults.adapter_scale),
                          logprobs=values.get("logprobs", task.defaults.logprobs))


def checked_text(name: str, value: Any) -> str:
    """A text field as it came in (any unicode at all), or a ValueError naming the field and,
    for text that is too long, the limit."""
    said = SAID_AS.get(name, name)
    if not isinstance(value, str):
        raise ValueError(f"{said} must be text, got {type(value).__name__}")
    check_size(said, len(value), MAX_CHARS[name])
    return value


def check_size(name: str, characters: int, limit: int) -> None:
    """Refuse a text longer than the app serves (a ValueError the user sees), before any work on it."""
    if characters > limit:
        raise ValueError(f"{name} is too long: {characters:,} characters; the limit is {limit:,}")


def check_count(what: str, count: int, limit: int) -> None:
    """Refuse a list longer than the app serves ("too many example pairs: 70; the limit is 64"),
    before any work on it."""
    if count > limit:
        raise ValueError(f"too many {what}: {count:,}; the limit is {limit:,}")


def article_room(loaded: LoadedModel, article: str, max_new_tokens: int, adapter: bool) -> list[str]:
    """How much of the context an article's summary prompt takes, and what it had to cut to fit:
    the task's own build_prompt decides, so this says exactly what a run will do. A ValueError
    where a run would refuse the article."""
    prompt = TASKS["summarize"].prompt(SummarizeInputs(checked_text("article", article)), loaded.tokenizer,
                                       loaded.context, max_new_tokens, adapter)
    left = new_token_budget(max_new_tokens, len(prompt.ids), loaded.context)  # what a run may generate
    return [f"{len(prompt.ids):,} of {loaded.context:,} context tokens in the prompt; the summary may use up to {left:,}",
            *prompt.notes]


def outcome_of(done: TaskDone, task: Task, params: SamplingParams, adapter: str) -> Outcome:
    """How to reproduce the run (seed, token counts, speed, why it stopped; `adapter`, where the
    task has one: adapter_state, or compared_state for a comparison, since the prompt and output
    differ with it; the settings changed from the task's defaults, which the seed alone does not
    give back) and what was cut."""
    return Outcome.done(done.result, None if task.adapter is None else adapter,
                        changed_settings(params, task.defaults), done.prompt.notes)


def changed_settings(params: SamplingParams, defaults: SamplingParams) -> list[tuple[str, float]]:
    """Each decoding setting that differs from the task's default, with its value."""
    return [(name, getattr(params, name)) for name, _ in SETTINGS if getattr(params, name) != getattr(defaults, name)]


def adapter_state(adapter_on: bool, adapter_scale: float) -> str:
    if not adapter_on:
        return "adapter off"
    return "adapter on" if adapter_scale == 1 else f"adapter on at strength {adapter_scale:g}"


def compared_state(adapter_scale: float, shown_on: bool) -> str:
    """A comparison's status part: both sides ran; the line's counts, and the output box, are the
    side the adapter switch picks (`shown_on`), as a run without Compare would have shown."""
    on = adapter_state(True, adapter_scale).removeprefix("adapter ")
    return f"adapter off vs {on}: the output and counts are with {adapter_state(shown_on, 1)}"


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


def run(api: TaskAPI, host: ModelHost, values: dict[str, Any],
        cancel: threading.Event | None = None) -> Iterator[tuple[str, Outcome | None, str, list]]:
    """Stream (text so far, outcome, prompt sent, logprobs) for one request, as often as a Pacer of
    MAX_UPDATES_PER_SECOND lets it; the outcome (None until then), prompt and logprobs (with the
    logprobs setting: each generated token's, see engine.generate.Result) come with the last
    update, which always goes, and each update holds all the text so far. Bad input ends it with a
    refused outcome, a failure with a fault's, after the text made before it."""
    if host.remote:  # another machine's replicas run it (serve/backend.py)
        yield from host.run(api, values, cancel)
        return
    loaded = host.current  # once: a model switch does not reach a running request
    sent, held_back, pacer = 0, None, Pacer(MAX_UPDATES_PER_SECOND)
    try:
        params = sampling_params(api.task, values)
        inputs = api.make_inputs(**{p.name: values[p.name] for p in api.params})
        adapter = values.get("adapter", False)
        if not isinstance(adapter, bool):
            raise ValueError(f"adapter must be true or false, got {brief(adapter)}")
        # Through the model's scheduler: concurrent requests are decoded in one batch. Closing the
        # events, however this ends, gives the request's row back at once.
        with closing(run_task(api.task, loaded.scheduler, loaded.tokenizer, inputs, params, adapter, cancel,
                              values.get("forced", ()))) as events:
            for event in events:
                if isinstance(event, TaskDone):
                    if event.result.stop_reason == "cancelled":
                        log.info("/%s: stopped by its user after %d tokens", api.name, event.result.generated_tokens)
                    sent += 1
                    outcome = outcome_of(event, api.task, params, adapter_state(adapter, params.adapter_scale))
                    yield event.text, outcome, event.prompt.text, event.result.logprobs
                elif pacer.due(time.monotonic()):
                    sent, held_back = sent + 1, None
                    yield event.text, None, "", []
                else:
                    held_back = event.text
    except ValueError as error:  # the input's: the message names the field and why
        yield "", Outcome.refused(str(error)), "", []
    except GeneratorExit:  # Gradio closes the run when its client cancels or goes away
        log.info("/%s: cancelled, or its client left, after %d updates; its decoding row is freed", api.name, sent)
        raise
    except Exception as error:  # a fault in the app, not in the input: say so, and keep serving
        if held_back is not None:  # the text made before the fault, which the user would not see otherwise
            yield held_back, None, "", []
        yield "", Outcome.fault(f"/{api.name} on {loaded.name}", error), "", []


def run_compare(api: TaskAPI, host: ModelHost, values: dict[str, Any],
                cancel: threading.Event | None = None) -> Iterator[tuple[list[str], Outcome | None, dict | None]]:
    """The request twice at once, adapter off and on, under one seed, so both draw the same random
    numbers at every step: (both texts so far, None, None) as often as the Pacer lets, then the
    texts, the outcome of the side the adapter switch picks (compared_outcome) and the comparison
    (compare_sides). Stop (cancel) ends
    both; refusals and faults end it with their outcome, as in `run`."""
    if host.remote:
        yield from host.run_compare(api, values, cancel)
        return
    loaded = host.current
    try:
        params = sampling_params(api.task, values)
        params = replace(params, seed=resolve_seed(params.seed), logprobs=max(params.logprobs, TOP_SHOWN))
        inputs = api.make_inputs(**{p.name: values[p.name] for p in api.params})
        sides = [run_task(api.task, loaded.scheduler, loaded.tokenizer, inputs, params, adapter_on, cancel)
                 for adapter_on in (False, True)]
        texts, done, pacer = ["", ""], [None, None], Pacer(MAX_UPDATES_PER_SECOND)
        with closing(sides[0]), closing(sides[1]):
            while None in done:
                for side, events in enumerate(sides):  # both decode in one batch: a token of each
                    if done[side] is None:
                        event = next(events)
                        texts[side] = event.text
                        if isinstance(event, TaskDone):
                            done[side] = event
                if None in done and pacer.due(time.monotonic()):
                    yield list(texts), None, None
        comparison = in_thread_of_its_own(lambda: compare_sides(loaded, api.task.adapter, done, params))
        yield [d.text for d in done], compared_outcome(done, api.task, params, bool(values["adapter"])), comparison
    except ValueError as error:
        yield ["", ""], Outcome.refused(str(error)), None
    except GeneratorExit:
        log.info("/%s: a comparison was cancelled, or its client left; its decoding rows are freed", api.name)
        raise
    except Exception as error:
        yield ["", ""], Outcome.fault(f"/{api.name} compare on {loaded.name}", error), None


# serve.messages: other_side_note
OTHER_SIDE_NOTE = "{side}: {note}"


def compared_outcome(done: list[TaskDone], task: Task, params: SamplingParams, shown_on: bool) -> Outcome:
    """A comparison's outcome: the shown side's (`shown_on`: the adapter-on side), with the notes
    only the other side made, marked as its own (the English a French -> German run went
    through, the example pairs it dropped to fit)."""
    shown, other = (done[1], done[0]) if shown_on else (done[0], done[1])
    outcome = outcome_of(shown, task, params, compared_state(params.adapter_scale, shown_on))
    for note in other.prompt.notes:
        if note not in shown.prompt.notes:
            outcome = outcome.noted(OTHER_SIDE_NOTE.format(side=adapter_state(not shown_on, 1), note=note))
    return outcome


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


def look_inside(host: ModelHost, prompt: Any, layer: Any, head: Any, adapter: str | None) -> LiveView:
    """The live view of `prompt` (layer and head from 1, held to the model's), the logit lens with
    `adapter` (None: the base model). Bad input is a ValueError naming the field, under the task
    tabs' limits."""
    if host.remote:
        return host.look_inside(prompt, layer, head, adapter)
    loaded = host.current  # once: a model switch meanwhile does not change this request
    config = loaded.model.config
    checked_text("prompt", prompt)
    layer = checked_slider("layer", layer, 1, config.n_layer)
    head = checked_slider("head", head, 1, config.n_head)
    check_adapter(loaded.model, adapter)
    # A forward pass is parallel work: not in a server's worker thread, which lives on
    # (engine/scheduler.py, in_thread_of_its_own, says why).
    seen = in_thread_of_its_own(lambda: inspect_prompt(loaded.model, loaded.tokenizer, prompt, layer - 1, head - 1))
    lens = in_thread_of_its_own(lambda: logit_lens(loaded.model, loaded.tokenizer, prompt, adapter))
    return LiveView(loaded.name, config.n_layer, config.n_head, seen, lens)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending first counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_sides(loaded: LoadedModel, adapter: str, done: list[TaskDone], params: SamplingParams) -> dict:
    """Each side's tokens with their log-probabilities, the same tokens' log-probabilities under
    the other side (its prompt, its adapter setting), and the first token where they part."""
    off, on = done
    tokens = [off.result.token_ids, on.result.token_ids]
    eos_id = loaded.tokenizer.eos_id
    under_other = [score_tokens(loaded.model, on.prompt.ids, tokens[0], params, adapter, eos_id),
                   score_tokens(loaded.model, off.prompt.ids, tokens[1], params, None, eos_id)]
    return {"entries": [off.result.logprobs, on.result.logprobs], "under_other": under_other,
            "prompts": [off.prompt.text, on.prompt.text], "diverges_at": first_difference(*tokens)}


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

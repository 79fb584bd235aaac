"""The host of the model in this process (serve/host.py's Host): the one place that holds the
model every request runs on, and runs them.

The app is started with a list of models (the bundled one, hub ids, local directories); the
first is loaded, and the UI may switch among the others. Where loading is allowed (app.py's
--allow-load), the page may also load a hub id or a local directory typed into it, which joins the
list, and unload one, which leaves it. Only the model being served is held in memory, and
beside it the one it was last compared with (a comparison of two models, serve/comparing.py).
Each request takes `host.current` once, at its start, so a switch never changes a request that
is already running. Each loaded model has its own Scheduler, which decodes the requests running
on it in one batch (see engine/scheduler.py).

The browser, `gradio_client` and /v1 all end up in `ModelHost.run`, which takes plain values,
waits for the request's turn in the host's one queue (serve/admission.py: first come, first
served, whichever way the request came in) and yields updates at most MAX_UPDATES_PER_SECOND
times a second, ending with the run's outcome record (serve/outcome.py). Bad input of any kind
ends it refused, with the message that names the field and the limit, so the caller sees why and
the app keeps serving; a generation that fails, or is cancelled, or whose client leaves, frees
its decoding row and is logged in one line.
"""
from __future__ import annotations

import contextvars
import gc
import hashlib
import logging
import math
import threading
import time
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable, Iterator, Sequence

import psutil
import torch

from engine import kernels, prepare_for_serving
from engine.generate import SamplingParams, new_token_budget, score_tokens
from engine.patching import Progress
from engine.scheduler import Scheduler, in_thread_of_its_own
from engine.steering import Steering, residual_norm, steered, steering_vector
from model import GPT2, GPT2Config, load_pretrained
from model.adapters import adapter_names, adapters_on_by_default
from model.checkpoint import pick_device, resolve_checkpoint
from model.tokenizer import Tokenizer
from tasks import TASKS, SummarizeInputs, Task, TaskDone, next_prompt, run_task

from .admission import DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE, RunQueue, Ticket, Waiting
from .apis import CHAT_API
from .comparing import (STEERING, Axis, Comparison, compared_outcome, no_steering, parse_compare, shown_side,
                        side_labels, side_requests)
from .host import CompareUpdate, RunUpdate
from .inspection import inspect_prompt, logit_lens
from .limits import brief, check_setting
from .messages import (MODEL_LINE, MODEL_LINE_DECODING, MODEL_LINE_QUANTIZED, Message, Refusal, english, render,
                       said)
from .outcome import Outcome
from .running import (MAX_UPDATES_PER_SECOND, SETTING_RANGES, TOP_SHOWN, LiveView, Pacer, TaskAPI, adapter_state,
                      checked_slider, checked_text, drawn_seed, outcome_of, sampling_params, steering_asked,
                      steering_state)
from .tracing import MAX_CHARS as TRACE_CHARS, Trace, trace
from .vectors import SteeringVector

BUNDLED = "bundled"
# What the residual's typical norm is measured on for a steering vector that came without texts (a
# llama.cpp control vector): the prompt DESIGN.md's steering probe continues.
NORM_REFERENCE = "Once upon a time, there was a little girl named Lily. She felt"
# What a load reports to its progress callback, in this order: the files fetched (a hub id's, from
# the local cache first), the weights read, the engine's fast paths put on.
LOAD_STEPS = ("download", "load", "kernels")
BYTES_PER_PARAMETER = 4  # every model is read as float32 (int8 is made from that)
log = logging.getLogger(__name__)


class ModelLoadError(Refusal):
    """A model could not be loaded: its message says which and why."""


@dataclass(frozen=True)
class LoadedModel:
    name: str  # as given at start-up
    model: GPT2
    tokenizer: Tokenizer
    scheduler: Scheduler  # what requests generate through
    quantize: str | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def context(self) -> int:
        return self.model.config.n_positions

    @property
    def adapters(self) -> list[str]:
        return adapter_names(self.model)

    @property
    def adapters_on(self) -> list[str]:
        """The adapters the checkpoint's evaluation found better than the prompt alone."""
        return adapters_on_by_default(self.model)

    @cached_property
    def vocabulary(self) -> str:
        """A digest of the tokenizer's tokens, their bytes in id order: two models with the same one
        read and write the same ids (serve/comparing.py scores one's tokens under the other)."""
        digest = hashlib.sha256(self.tokenizer.name.encode())
        for id in range(self.tokenizer.vocab_size):
            data = self.tokenizer.token_bytes(id)
            digest.update(len(data).to_bytes(4, "little") + data)
        return digest.hexdigest()

    @property
    def decode_path(self) -> str:
        """Which path decodes this model now, in words: its device where that is not the CPU."""
        return kernels.decode_path() if self.model.device.type == "cpu" else str(self.model.device)

    def describe(self, lang: str = "en") -> str:
        """One Markdown line in `lang`: what is loaded, for the model panel."""
        device = self.model.device
        line = MODEL_LINE[lang].format(
            name=self.name, millions=f"{self.model.num_parameters() / 1e6:.1f}", context=self.context,
            tokenizer=self.tokenizer.name, vocab=f"{self.tokenizer.vocab_size:,}",
            adapters=", ".join(self.adapters) or said("none", lang), device=device)
        if self.quantize:
            line += MODEL_LINE_QUANTIZED[lang].format(quantize=self.quantize)
        if device.type == "cpu":
            path = path_message(kernels.current_path(), int8=self.quantize == "int8")
            line += MODEL_LINE_DECODING[lang].format(path=render(path, lang))
        return line


DETAIL_OF = {"no_avx2": "capability", "build_failed": "kind"}  # the field a reason's detail fills


def path_message(path: kernels.DecodePath, int8: bool = False) -> Message:
    """Which path decodes, as the model line says it; for int8 weights, which integer dot
    products multiply them (kernels.INT8_DOT)."""
    if not path.why:
        if int8:
            return Message.keyed("kernels_on_int8", capability=kernels.CAPABILITY, int8_dot=kernels.INT8_DOT)
        return Message.keyed("kernels_on", capability=kernels.CAPABILITY)
    if path.why in DETAIL_OF:  # its own message, with the CPU's capability or the build's error
        return Message.keyed("kernels_off", reason=Message.keyed(path.why, **{DETAIL_OF[path.why]: path.detail}))
    return Message.keyed("kernels_off", reason=kernels.WHY_NOT[path.why])


def no_progress(step: str) -> None:
    """A load's progress, where nobody follows it."""


class ModelHost:
    def __init__(self, names: Sequence[str], device: str = "auto", quantize: str | None = None,
                 allow_load: bool = False, concurrency: int = DEFAULT_CONCURRENCY,
                 queue_size: int = DEFAULT_QUEUE_SIZE):
        """Load the first of `names`; the others can be switched to later. Raises ModelLoadError
        when the first cannot be loaded: there is nothing to serve without it. quantize="int8"
        loads every model with int8 weights (see engine/quantize.py). allow_load: whether `load`
        and `unload` may change the list (off by default: anyone who reaches the page could fill
        the memory). At most `concurrency` runs go at once, and `queue_size` more wait for their
        turn (admission.py)."""
        self.queue = RunQueue(concurrency, queue_size)
        self.names = tuple(dict.fromkeys(str(name) for name in names))
        if not self.names:
            raise ValueError("at least one model is needed")
        self.device = pick_device(device)
        self.quantize = quantize
        self.allow_load = allow_load
        self._switching = threading.Lock()  # one load at a time; requests never wait for it
        self.loading: str | None = None  # the model being loaded to switch to, while it loads
        self._current = self._load(self.names[0])
        self._held: LoadedModel | None = None  # the model last compared with the one served (ModelHost.model)

    @property
    def current(self) -> LoadedModel:
        return self._current

    def settling(self) -> bool:
        """Whether the model line may still change by itself: while the decode kernels build."""
        return not kernels.settled()

    def switch(self, name: str) -> LoadedModel:
        """Load `name` and serve it from now on. When it fails, the current model stays."""
        if name not in self.names:
            raise ModelLoadError("not_a_model", name=repr(name), names=", ".join(self.names))
        with self._switching:
            return self._serve(name)

    def load(self, name: str, progress: Callable[[str], None] = no_progress) -> LoadedModel:
        """Load `name` (a hub id or a local checkpoint directory), add it to the models and serve it
        from now on; `progress` is told each of LOAD_STEPS as it starts. When it cannot be had
        (offline, not a GPT-2, too big for the memory free), the current model stays."""
        self._check_allowed()
        name = name.strip()
        if not name:
            raise ModelLoadError("no_model_named")
        with self._switching:
            loaded = self._serve(name, progress)
            self.names = tuple(dict.fromkeys((*self.names, name)))
        return loaded

    def unload(self, name: str) -> LoadedModel:
        """Take `name` off the models; where it is the one served, serve the first that stays. Its
        memory is freed once the requests still running on it end. Returns the model served."""
        self._check_allowed()
        with self._switching:
            if name not in self.names:
                raise ModelLoadError("not_a_model", name=repr(name), names=", ".join(self.names))
            staying = tuple(other for other in self.names if other != name)
            if not staying:
                raise ModelLoadError("last_model", name=name)
            if name == self._current.name:
                self._serve(staying[0])
            if self._held is not None and self._held.name == name:
                self._held = None
            self.names = staying
        gc.collect()  # now, not at the collector's next pass: an adapter and the live view leave reference cycles
        return self._current

    def _check_allowed(self) -> None:
        if not self.allow_load:
            raise ModelLoadError("load_not_allowed", flag="--allow-load")  # app.py's flag

    def _serve(self, name: str, progress: Callable[[str], None] = no_progress) -> LoadedModel:
        """Load `name` and serve it, unless it is served already; the caller holds _switching."""
        if self._held is not None and self._held.name == name:  # in memory already, beside the one served
            self._current, self._held = self._held, None
        elif name != self._current.name:
            self.loading = name
            try:
                self._current = self._load(name, progress)
            finally:
                self.loading = None
        return self._current

    def _prepare(self, name: str, progress: Callable[[str], None]) -> tuple[GPT2, Tokenizer]:
        """The model as it will serve: loaded, quantised if asked, with the engine's fast paths on
        (the kernels build in the background; until then it decodes on PyTorch)."""
        progress("download")
        directory = resolve_checkpoint(None if name == BUNDLED else name,
                                       check_config=lambda directory: check_memory(name, GPT2Config.load(directory)))
        progress("load")
        model, tokenizer = load_pretrained(directory, device=self.device)
        progress("kernels")
        return prepare_for_serving(model, self.quantize), tokenizer

    def _load(self, name: str, progress: Callable[[str], None] = no_progress) -> LoadedModel:
        log.info("loading model %s on %s", name, self.device)
        # With the caller's context variables, which a progress callback may need (Gradio's progress
        # bar finds its event by them).
        prepare = contextvars.copy_context().run
        try:  # in a thread that ends, so that the scheduler's thread decodes without a second OpenMP pool
            model, tokenizer = in_thread_of_its_own(lambda: prepare(self._prepare, name, progress))
        except ModelLoadError as refused:  # before a weight was read (the memory), in its own words
            log.warning("could not load model %s: %s", name, english(refused.message))
            raise
        except Exception as error:  # whatever goes wrong, the model being served must keep serving
            log.warning("could not load model %s: %s", name, error)
            reason = str(error).removeprefix(f"{name}: ")  # a checkpoint error starts with the path it names
            raise ModelLoadError("load_failed", name=name, reason=reason) from error
        loaded = LoadedModel(name, model, tokenizer, Scheduler(model), self.quantize)
        log.info("model %s decodes on %s", name, loaded.decode_path)
        return loaded

    def model(self, name: str | None = None) -> LoadedModel:
        """The loaded model `name` for a request (None: the one served): the one served, or the one
        held beside it for comparisons (serve/comparing.py), loaded now where it is neither, in place
        of the one held before. Its weights are checked against the memory free beside the models
        already held, and a refusal leaves the one served as it was."""
        current = self._current  # once: a switch meanwhile does not change which this request gets
        if name is None or name == current.name:
            return current
        if name not in self.names:
            raise Refusal("compare_model", name="compare", model=name, names=", ".join(self.names))
        with self._switching:
            if self._held is None or self._held.name != name:
                self._held = None  # freed before the next is read, where nothing runs on it any more
                gc.collect()
                self._held = self._load(name)
            return self._held

    def prepared(self, api: TaskAPI, values: dict[str, Any]) -> "Prepared":
        """The request `values` made ready on its model (values["model"], a comparison's side; None:
        the one served), checked: a ValueError names the field and why."""
        loaded = self.model(values.get("model"))
        params = sampling_params(api.task, values)
        inputs = api.make_inputs(**{p.name: values[p.name] for p in api.params})
        adapter = values.get("adapter", False)
        if not isinstance(adapter, bool):
            raise Refusal("adapter_bool", value=brief(adapter))
        if adapter and api.task.adapter is not None and api.task.adapter not in loaded.adapters:
            raise Refusal("no_model_adapter", adapter=api.task.adapter, adapters=", ".join(loaded.adapters) or "none")
        return Prepared(loaded, params, inputs, adapter, *steering_of(loaded, values))

    def run(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
            per_token: bool = False, waiting: bool = False) -> Iterator[RunUpdate | Waiting]:
        """Stream (text so far, outcome, prompt sent, logprobs) for one request, as often as a Pacer of
        MAX_UPDATES_PER_SECOND lets it (per_token: at every token that changes the task's text, as
        /v1 streams); the outcome (None until then), prompt and logprobs (with the logprobs setting:
        each generated token's, see engine.generate.Result) come with the last update, which always
        goes, and each update holds all the text so far. The request first waits for its turn in
        the queue (admission.py), telling its place (Waiting) where `waiting` asks for it: a full
        queue refuses it, and Stop (`cancel`) before its turn withdraws it. Bad input ends it with a
        refused outcome, a failure with a fault's, after the text made before it. The request runs
        on the model served when its turn comes (or on values["model"], one side of a comparison
        continued from a token)."""
        try:
            with self.queue.turn() as ticket:
                if not (yield from ticket.wait(cancel, tell=waiting)):
                    yield "", Outcome.withdrawn(), "", []
                    return
                yield from self._decoded(api, values, cancel, per_token, ticket)
        except ValueError as error:  # the input's, or a full queue: the message names the field and why
            yield "", Outcome.refused(error), "", []

    def _decoded(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None, per_token: bool,
                 ticket: Ticket) -> Iterator[RunUpdate]:
        """`run`'s request once its turn has come (`ticket`, left once its outcome is known): made
        ready (a refusal is `run`'s to say, a ValueError), then through its model's scheduler."""
        sent, held_back = 0, None
        pacer = Pacer(math.inf if per_token else MAX_UPDATES_PER_SECOND)
        where = f"/{api.name} on {values.get('model') or self.current.name}"
        try:
            side = self.prepared(api, values)
            # Through the model's scheduler: concurrent requests are decoded in one batch. Closing the
            # events, however this ends, gives the request's row back at once.
            with closing(side.events(api.task, cancel, values.get("forced", ()))) as events:
                for event in events:
                    if isinstance(event, TaskDone):
                        if event.result.stop_reason == "cancelled":
                            log.info("/%s: stopped by its user after %d tokens", api.name, event.result.generated_tokens)
                        sent += 1
                        ticket.leave()
                        yield event.text, side.outcome(event, api.task), event.prompt.text, event.result.logprobs
                    elif pacer.due(time.monotonic()):
                        sent, held_back = sent + 1, None
                        yield event.text, None, "", []
                    else:
                        held_back = event.text
        except ValueError:
            raise
        except GeneratorExit:  # Gradio closes the run when its client cancels or goes away
            log.info("/%s: cancelled, or its client left, after %d updates; its decoding row is freed", api.name, sent)
            raise
        except Exception as error:  # a fault in the app, not in the input: say so, and keep serving
            if held_back is not None:  # the text made before the fault, which the user would not see otherwise
                yield held_back, None, "", []
            yield "", Outcome.fault(where, error), "", []

    def run_compare(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
                    waiting: bool = False) -> Iterator[CompareUpdate | Waiting]:
        """The request (api.request: defaults for what it leaves out) twice at once under one seed,
        the two sides differing in what values["compare"] names (serve/comparing.py), each on its
        own model's scheduler. (Both texts so far, None, None) as often as the Pacer lets, then the
        texts, the outcome of the side shown (compared_outcome) and the Comparison. It takes one
        turn in the queue; waiting, a full queue and Stop before its turn are as in `run`. Stop
        (cancel) ends both; refusals and faults end it with their outcome, as in `run`."""
        try:
            with self.queue.turn() as ticket:
                if not (yield from ticket.wait(cancel, tell=waiting)):
                    yield ["", ""], Outcome.withdrawn(), None
                    return
                yield from self._compared(api, values, cancel, ticket)
        except ValueError as error:
            yield ["", ""], Outcome.refused(error), None

    def _compared(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None,
                  ticket: Ticket) -> Iterator[CompareUpdate]:
        """`run_compare`'s two sides once its turn has come, as `_decoded` runs one."""
        try:
            values = api.request(values)
            values["seed"] = drawn_seed(values["seed"])  # one seed, drawn once, for both sides
            axis = parse_compare(values.get("compare"), self.names)
            asked = side_requests(axis, values, self.current.name)
            sides = [self.prepared(api, {**values, **change}) for change in asked]
            if axis.kind == STEERING and sides[1].steering is None:
                raise no_steering()
            sides = [replace(side, params=replace(side.params, logprobs=max(side.params.logprobs, TOP_SHOWN)))
                     for side in sides]
            done = yield from streamed_together([side.events(api.task, cancel) for side in sides])
            comparison = in_thread_of_its_own(lambda: compared(api.task, axis, asked, sides, done,
                                                               shown_side(axis, values)))
            ticket.leave()
            yield [side.text for side in done], compared_outcome(comparison), comparison
        except ValueError:
            raise
        except GeneratorExit:
            log.info("/%s: a comparison was cancelled, or its client left; its decoding rows are freed", api.name)
            raise
        except Exception as error:
            yield ["", ""], Outcome.fault(f"/{api.name} compare on {self.current.name}", error), None

    def steering_vector(self, values: dict[str, Any]) -> SteeringVector:
        """The vector a request's steering adds (its lines', or its file's), as serve/vectors.py
        writes it into files; refused as a run would be, or where it asks for no steering."""
        loaded = self.current
        steering, state = steering_of(loaded, values)
        if steering is None:
            raise Refusal("steer_nothing")
        return SteeringVector(steering.vector.tolist(), steering.layer, steering.strength,
                              state.field("positive").splitlines(), state.field("negative").splitlines(), loaded.name,
                              loaded.config.n_layer)

    def look_inside(self, prompt: Any, layer: Any, head: Any, adapter: str | None) -> LiveView:
        """The live view of `prompt` (layer and head from 1, held to the model's), the logit lens with
        `adapter` (None: the base model). Bad input is a ValueError naming the field, under the task
        tabs' limits."""
        loaded = self.current  # once: a model switch meanwhile does not change this request
        config = loaded.model.config
        checked_text("prompt", prompt)
        layer = checked_slider("layer", layer, 1, config.n_layer)
        head = checked_slider("head", head, 1, config.n_head)
        if adapter is not None and adapter not in loaded.adapters:
            raise Refusal("no_model_adapter", adapter=adapter, adapters=", ".join(loaded.adapters) or "none")
        # A forward pass is parallel work: not in a server's worker thread, which lives on
        # (engine/scheduler.py, in_thread_of_its_own, says why).
        seen = in_thread_of_its_own(lambda: inspect_prompt(loaded.model, loaded.tokenizer, prompt, layer - 1, head - 1))
        lens = in_thread_of_its_own(lambda: logit_lens(loaded.model, loaded.tokenizer, prompt, adapter))
        return LiveView(loaded.name, config.n_layer, config.n_head, seen, lens)

    def trace(self, clean: Any, corrupted: Any = "", answer: Any = "", noise_span: Any = "",
              progress: Progress | None = None) -> Trace:
        """The trace of `clean` against `corrupted` (serve/tracing.py), on the base model; progress(done,
        total) as it goes. Bad input is a ValueError naming the field."""
        loaded = self.current
        texts = {name: checked_text(name, value, TRACE_CHARS[name]) for name, value in
                 (("clean", clean), ("corrupted", corrupted), ("answer", answer), ("noise_span", noise_span))}
        return in_thread_of_its_own(lambda: trace(loaded.model, loaded.tokenizer, **texts, progress=progress))

    def article_room(self, article: str, max_new_tokens: int, adapter: bool) -> list[Message]:
        """How much of the context an article's summary prompt takes, and what it had to cut to fit:
        the task's own build_prompt decides, so this says exactly what a run will do. A ValueError
        where a run would refuse the article."""
        loaded = self.current
        prompt = TASKS["summarize"].prompt(SummarizeInputs(checked_text("article", article)), loaded.tokenizer,
                                           loaded.context, max_new_tokens, adapter)
        left = new_token_budget(max_new_tokens, len(prompt.ids), loaded.context)  # what a run may generate
        return [Message.keyed("article_length", tokens=len(prompt.ids), context=loaded.context, left=left),
                *prompt.notes]

    def conversation_room(self, message: Any, history: Any, persona: Any, max_new_tokens: Any) -> list[Message]:
        """How much of the context the prompt the next message goes in takes (the message as far as
        it is written, empty too), counted with the model's tokenizer, and the oldest turns it will
        leave out to fit: the task's own prompt decides (tasks.next_prompt), so this says what a
        run will send. A ValueError where a run would refuse the conversation."""
        loaded = self.current
        inputs = CHAT_API.make_inputs(message, history, persona)
        most = check_setting("max_new_tokens", max_new_tokens, *SETTING_RANGES["max_new_tokens"], integer=True)
        prompt = next_prompt(inputs, loaded.tokenizer, loaded.context, most)
        tokens = len(prompt.ids)
        return [Message.keyed("context_used", tokens=tokens, context=loaded.context, share=tokens / loaded.context),
                *map(upcoming, prompt.notes)]


def check_memory(name: str, config: GPT2Config) -> None:
    """Refuse a model whose weights alone would not fit in the memory free now: an out-of-memory
    kill would take the model being served, and every user's request, with it."""
    needed = config.parameter_count * BYTES_PER_PARAMETER
    available = psutil.virtual_memory().available
    if needed > available:
        raise ModelLoadError("not_enough_memory", name=name, needed=needed / 2**30, available=available / 2**30)


# A note of what a run's prompt dropped, as said of the next prompt, before it is sent.
UPCOMING = {"dropped_turn": "will_drop_turn", "dropped_turns": "will_drop_turns"}


def upcoming(note: Message) -> Message:
    """A note of what a run's prompt dropped, as said of the next prompt (UPCOMING)."""
    return Message(UPCOMING.get(note.key, note.key), note.fields)


def steering_of(loaded: LoadedModel, values: dict[str, Any]) -> tuple[Steering | None, Message | None]:
    """The request's steering (serve.running.steering_asked) on the loaded model, its vector computed
    once for the run (or a file's, as it came), and the status part that names it; (None, None)
    where it asks for none."""
    asked = steering_asked(values, loaded.config)
    if asked is None:
        return None, None
    model, tokenizer = loaded.model, loaded.tokenizer
    if asked.vector is None:
        # forward passes: not in a server's worker thread, which lives on (in_thread_of_its_own says why)
        vector, typical = in_thread_of_its_own(lambda: steering_vector(model, tokenizer, asked.positive,
                                                                       asked.negative, asked.layer))
    else:  # a file's vector, measured against the residual of its own texts where it has them
        texts = [*asked.positive, *asked.negative] or [NORM_REFERENCE]
        typical = in_thread_of_its_own(lambda: residual_norm(model, tokenizer, texts, asked.layer))
        vector = torch.tensor(asked.vector, dtype=model.transformer.wte.weight.dtype, device=model.device)
    steering = Steering(asked.layer, vector, asked.strength)
    return steering, steering_state(asked, float(vector.norm()), typical)


@dataclass(frozen=True)
class Prepared:
    """A request made ready on the loaded model it runs on (ModelHost.prepared): its checked
    settings, inputs, adapter switch and steering."""
    loaded: LoadedModel
    params: SamplingParams
    inputs: Any
    adapter: bool
    steering: Steering | None
    steered: Message | None  # the status part that names the steering (steering_state)

    @property
    def model(self) -> str:
        return self.loaded.name

    def events(self, task: Task, cancel: threading.Event | None, forced: Sequence[int] = ()):
        """The task's events, through the model's scheduler (tasks.run_task)."""
        return run_task(task, self.loaded.scheduler, self.loaded.tokenizer, self.inputs, self.params, self.adapter,
                        cancel, forced, self.steering)

    def outcome(self, done: TaskDone, task: Task) -> Outcome:
        return outcome_of(done, task, self.params, adapter_state(self.adapter, self.params.adapter_scale), self.steered)

    def scored(self, task: Task, prompt: list[int], tokens: list[int]) -> list[float]:
        """Each of `tokens`' log-probability after `prompt` under this request's model, settings,
        adapter and steering: what this side would have given another side's tokens."""
        with steered(self.loaded.model, self.steering):
            return score_tokens(self.loaded.model, prompt, tokens, self.params, task.adapter if self.adapter else None,
                                self.loaded.tokenizer.eos_id)


def streamed_together(runs: list[Iterator]) -> Iterator[tuple[list[str], None, None]]:
    """Both runs' texts so far, as often as a Pacer of MAX_UPDATES_PER_SECOND lets, a token of each
    in turn (each decodes in its own model's batch meanwhile); returns their TaskDones. Closing it
    closes both, which frees their decoding rows."""
    texts, done, pacer = [""] * len(runs), [None] * len(runs), Pacer(MAX_UPDATES_PER_SECOND)
    with ExitStack() as closing_all:
        for run in runs:
            closing_all.enter_context(closing(run))
        while None in done:
            for side, events in enumerate(runs):
                if done[side] is None:
                    event = next(events)
                    texts[side] = event.text
                    if isinstance(event, TaskDone):
                        done[side] = event
            if None in done and pacer.due(time.monotonic()):
                yield list(texts), None, None
    return done


def compared(task: Task, axis: Axis, asked: tuple[dict, dict], sides: list[Prepared], done: list[TaskDone],
             shown: int) -> Comparison:
    """The Comparison of two finished sides: each side's tokens scored under the other where both
    share a tokenizer (forward passes: run it in a thread of its own)."""
    same = same_tokenizer(sides[0].loaded, sides[1].loaded)
    tokens = [side.result.token_ids for side in done]
    under_other = [sides[other].scored(task, done[other].prompt.ids, tokens[mine]) if same else None
                   for mine, other in ((0, 1), (1, 0))]
    outcomes = [side.outcome(finished, task) for side, finished in zip(sides, done)]
    return Comparison.of(axis, side_labels(axis, sides), asked, shown, done, outcomes, under_other, same)


def same_tokenizer(a: LoadedModel, b: LoadedModel) -> bool:
    """Whether two models' token ids mean the same text, so that one's tokens can be scored by the other."""
    return a.tokenizer is b.tokenizer or a.vocabulary == b.vocabulary

"""A model host on other machines: the page in front of a deployment (serve/cluster.py).

`python app.py --backend URL` serves the page with a RemoteHost in place of a ModelHost: every
tab's run, comparison and look inside goes to URL's /studio routes (serve/page_api.py), where a
replica checks it under the same limits and answers with the same outcome records, so the page,
its API and its errors are as they are with the model here. What the page shows of the model (its
name, adapters, shape, model line) comes from the backend at start, and again while the
backend's decode kernels build.

A backend that does not take the connection is said within CONNECT_TIMEOUT_S, one that stops
sending within SILENCE_S, in the tab's status line; a replica that stops in the middle of a stream
ends that run with a message that says to try again (another replica answers). Stop closes the
stream at once, which ends the run on its replica and frees its decoding row.

The page's runs take their turn in its own queue first (serve/admission.py, as a ModelHost's):
at most `concurrency` are sent to the deployment at once.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx

from engine.kernels import BUILDING
from model import GPT2Config

from .admission import DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE, RunQueue, Waiting
from .messages import Message, Refusal
from .model_host import ModelLoadError, no_progress
from .outcome import DONE, FAULT, Outcome, message_from_json
from .page_api import PREFIX, update_from_json, view_from_json
from .comparing import Comparison
from .running import (LiveView, TaskAPI, adapter_state, changed_settings, drawn_seed, sampling_params,
                      steering_asked, steering_state)
from .tracing import Trace
from .vectors import SteeringVector

CONNECT_TIMEOUT_S = 3  # how long a backend that is down takes to be said so
# How long a run may hear nothing from its replica: a request waiting in a busy replica's queue
# hears nothing until its first token.
SILENCE_S = 120
STOPPED_NOTE = Message.keyed("backend_stopped")


class BackendDown(ModelLoadError):
    """The backend does not answer; the message says where and why."""


@dataclass(frozen=True)
class RemoteModel:
    """What the page shows of the backend's model."""
    name: str
    adapters: list[str]
    adapters_on: list[str]
    config: GPT2Config
    decode_path: str
    lines: dict[str, str]  # the model line by language, as the backend's replica writes it
    url: str

    @property
    def context(self) -> int:
        return self.config.n_positions

    def describe(self, lang: str = "en") -> str:
        return self.lines[lang] + (f" · 由 {self.url} 提供" if lang == "zh" else f" · served by {self.url}")


class RemoteHost:
    """serve/host.py's Host for a model on a deployment's replicas."""

    def __init__(self, url: str, api_key: str | None = None, concurrency: int = DEFAULT_CONCURRENCY,
                 queue_size: int = DEFAULT_QUEUE_SIZE):
        """Ask the backend at `url` what it serves (with `api_key`, the deployment's --api-key);
        BackendDown where it does not answer. At most `concurrency` runs are sent it at once, and
        `queue_size` more wait here for their turn (admission.py)."""
        self.url = url.rstrip("/")
        self.queue = RunQueue(concurrency, queue_size)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(SILENCE_S, connect=CONNECT_TIMEOUT_S))
        self.loading: str | None = None  # the backend switches nothing from here
        self.allow_load = False  # nor loads: the deployment has the models its replicas were started with
        self._current = self.fetch_model()
        self.names = (self._current.name,)

    @property
    def current(self) -> RemoteModel:
        return self._current

    def switch(self, name: str) -> RemoteModel:
        if name != self._current.name:
            raise ModelLoadError("backend_only", name=name, url=self.url)
        return self._current

    def load(self, name: str, progress: Callable[[str], None] = no_progress) -> RemoteModel:
        raise ModelLoadError("backend_loads", url=self.url)

    def unload(self, name: str) -> RemoteModel:
        raise ModelLoadError("backend_loads", url=self.url)

    def settling(self) -> bool:
        """Whether the model line may still change: the backend's kernels build. Asks again."""
        if self._current.decode_path != BUILDING:
            return False
        try:
            self._current = self.fetch_model()
        except BackendDown:
            return True
        return self._current.decode_path == BUILDING

    def fetch_model(self) -> RemoteModel:
        try:
            response = self.http.get(f"{self.url}{PREFIX}/model", timeout=CONNECT_TIMEOUT_S * 2)
            response.raise_for_status()
        except httpx.HTTPError as error:
            raise BackendDown.saying(down_message(self.url, error)) from None
        info = response.json()
        return RemoteModel(info["name"], info["adapters"], info["adapters_on"], GPT2Config(**info["config"]),
                           info["decode_path"], info["line"], self.url)

    def run(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
            waiting: bool = False) -> Iterator[tuple[str, Outcome | None, str, list] | Waiting]:
        adapter = adapter_state(values.get("adapter", False), values.get("adapter_scale", 1.0))
        for update in self.updates(f"run/{api.name}", api, values, cancel, adapter, ["text"], waiting):
            if isinstance(update, Waiting):
                yield update
            else:
                yield update["text"], update["outcome"], update.get("prompt", ""), update.get("logprobs", [])

    def run_compare(self, api: TaskAPI, values: dict[str, Any], cancel: threading.Event | None = None,
                    waiting: bool = False) -> Iterator[tuple[list[str], Outcome | None, Comparison | None] | Waiting]:
        """The replica's comparison: values["compare"] goes with the request, as it names what differs."""
        try:
            values = api.request(values)  # what it leaves out, as the replica will fill it in
        except ValueError as error:
            yield ["", ""], Outcome.refused(error), None
            return
        adapter = adapter_state(values.get("adapter", False) is True, values.get("adapter_scale", 1.0))
        for update in self.updates(f"compare/{api.name}", api, values, cancel, adapter, ["texts"], waiting):
            yield update if isinstance(update, Waiting) else (update["texts"], update["outcome"],
                                                              update.get("comparison"))

    def updates(self, route: str, api: TaskAPI, values: dict, cancel: threading.Event | None, adapter: Message,
                kept: list[str], waiting: bool = False) -> Iterator[dict | Waiting]:
        """The backend's updates, each with its outcome as the record, once the run's turn has come
        in the page's queue (its places meanwhile, Waiting, where `waiting` asks for them): refused
        where the queue is full, withdrawn where Stop comes first. Where the stream ends before its
        last update, the text so far (the `kept` fields) with an outcome of its own: stopped by its
        user (seed, settings and `adapter` state, as far as they are known here), or a fault that
        says what happened to the backend."""
        values = {**values, "seed": drawn_seed(values.get("seed"))}
        last: dict = {name: "" if name == "text" else ["", ""] for name in kept}
        try:
            with self.queue.turn() as ticket:
                if not (yield from ticket.wait(cancel, tell=waiting)):  # Stop before its turn came
                    yield {**last, "outcome": Outcome.withdrawn()}
                    return
                for update in self.stream(route, values, cancel):
                    if isinstance(update, Outcome):  # the run ended here: Stop, or the backend failed
                        yield {**last, "outcome": update if update.kind == FAULT
                               else stopped(api, values, adapter, self._current.config)}
                        return
                    last = {name: update[name] for name in kept}
                    if update["outcome"] is not None:
                        ticket.leave()
                    yield update
        except ValueError as refused:  # a full queue; or settings that a stopped run's outcome cannot say
            yield {**last, "outcome": Outcome.refused(refused)}

    def stream(self, route: str, values: dict, cancel: threading.Event | None) -> Iterator[dict | Outcome]:
        """The backend's updates; an Outcome of its own where the stream ends before its last
        update: done where Stop closed it, a fault where the backend failed."""
        started = ended = False
        try:
            with self.http.stream("POST", f"{self.url}{PREFIX}/{route}", json=values) as response:
                response.raise_for_status()
                with closed_on(cancel, response.close):  # Stop ends a stream that is silent too
                    for line in response.iter_lines():
                        update = update_from_json(json.loads(line))
                        started, ended = True, update["outcome"] is not None
                        yield update
        except (httpx.HTTPError, ValueError, KeyError) as error:  # the connection, or a line cut short
            if cancel is not None and cancel.is_set():
                yield Outcome(DONE)
            elif not ended:
                yield Outcome(FAULT, cut_message(self.url) if started else down_message(self.url, error))
            return
        if cancel is not None and cancel.is_set() and not ended:
            yield Outcome(DONE)
        elif not ended:  # the replica went away mid-stream
            yield Outcome(FAULT, cut_message(self.url))

    def article_room(self, article: str, max_new_tokens: int, adapter: bool) -> list[Message]:
        return []  # the tokenizer is the backend's: a run there says what it cut

    def conversation_room(self, message: Any, history: Any, persona: Any, max_new_tokens: Any) -> list[Message]:
        return []  # as article_room

    def steering_vector(self, values: dict[str, Any]) -> SteeringVector:
        return SteeringVector.from_json(self.answer("steering", values))

    def look_inside(self, prompt: Any, layer: Any, head: Any, adapter: str | None) -> LiveView:
        return view_from_json(self.answer("look_inside", {"prompt": prompt, "layer": layer, "head": head,
                                                          "adapter": adapter}))

    def trace(self, clean: Any, corrupted: Any = "", answer: Any = "", noise_span: Any = "",
              progress: Callable[[int, int], None] | None = None) -> Trace:
        """The replica's trace (its progress is not told here: it answers once, when done)."""
        return Trace.from_json(self.answer("trace", {"clean": clean, "corrupted": corrupted, "answer": answer,
                                                     "noise_span": noise_span}))

    def answer(self, route: str, asked: dict) -> dict:
        """The backend's answer to `asked` at /studio/`route`; its refusal, or what happened to the
        backend, as a Refusal (said in the tab's status line)."""
        try:
            response = self.http.post(f"{self.url}{PREFIX}/{route}", json=asked)
            if response.status_code == 400:
                raise Refusal.saying(message_from_json(response.json()["refused"]))
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, KeyError) as error:
            raise Refusal.saying(down_message(self.url, error)) from None


class closed_on:
    """A block during which `close` is called as soon as `event` is set (from any thread)."""

    def __init__(self, event: threading.Event | None, close: Callable[[], None]):
        self.event, self.close, self.done = event, close, threading.Event()

    def __enter__(self):
        if self.event is not None:
            threading.Thread(target=self.watch, daemon=True).start()
        return self

    def watch(self):
        while not self.done.is_set():
            if self.event.wait(0.05):
                self.close()
                return

    def __exit__(self, *exc):
        self.done.set()


def down_message(url: str, error: Exception) -> Message:
    if isinstance(error, httpx.HTTPStatusError):
        return Message.keyed("backend_failed", url=url, status=error.response.status_code)
    return Message.keyed("backend_down", url=url, kind=type(error).__name__)


def cut_message(url: str) -> Message:
    return Message.keyed("backend_cut", url=url)


def stopped(api: TaskAPI, values: dict, adapter: Message, config: GPT2Config) -> Outcome:
    """The outcome of a run stopped by its user: what reproduces it (seed, settings, `adapter` state,
    steering), as far as it is known here: the vector's norms are measured on the replica."""
    params = sampling_params(api.task, values)
    steering = steering_asked(values, config)
    return Outcome(DONE, seed=params.seed, stop_reason="cancelled",
                   adapter=None if api.task.adapter is None else adapter,
                   changed=tuple(changed_settings(params, api.task.defaults)), notes=(STOPPED_NOTE,),
                   steering=None if steering is None else steering_state(steering))

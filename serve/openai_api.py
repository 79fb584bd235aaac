"""OpenAI's /v1 API beside the page, so that any client that speaks it (the `openai` package,
LangChain, editors, evaluation harnesses) can use the app unchanged.

- GET /v1/models: the model being served, and one id per task adapter (`bundled:translate`):
  a request under that id runs with that adapter switched on, and its task's decoding defaults
  where the request leaves a setting unset; GET /v1/models/{id}: one of them. Every id answers
  on both endpoints below.
- POST /v1/completions: the prompt continued, as the Generate tab continues it (under an adapter's
  id, as written: the adapter's prompt format is the client's to write).
- POST /v1/chat/completions: the messages as the Chat tab's transcript (a system message is the
  persona), the reply cut where the Chat tab cuts it; under `bundled:translate` or
  `bundled:summarize`, the last user message is the text that task's tab translates or
  summarises, and the reply is what the tab shows.

Both endpoints take one field of this app's own, `steering`: {"positive", "negative", "layer",
"strength"}, as the page's steering (the `openai` client sends it in `extra_body`).

Requests run through the host's run (serve/model_host.py), under the same limits and checks as
the page and the Gradio API, and take their turn in the same queue (serve/admission.py), first
come first served; a refusal is a 400 in OpenAI's error shape naming the field (`param`), an unknown
model a 404, a full queue a 429 with the page's message. The seed each choice ran with comes back in `system_fingerprint` (`seed-N`; the
choices of n > 1 run with N, N+1, ...), so a run can be repeated. Streaming (server-sent events,
a chunk per decoded token, ending `data: [DONE]`) stops the generation and frees its decoding row
when the client goes.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.generate import prompt_trace, token_logprobs
from engine.scheduler import in_thread_of_its_own
from engine.steering import steered
from model import GPT2Config
from tasks import LANGUAGES, TASKS, DialogueInputs, GenerateInputs, SummarizeInputs, Task, TranslateInputs
from tasks.base import room_to_generate

from .admission import QUEUE_FULL
from .limits import LIMITS, check_setting, check_temperature
from .messages import Message, Refusal, english, message_of
from .model_host import ModelHost, steering_of
from .outcome import REFUSED, Outcome
from .running import (MAX_CHARS, MAX_CHAT_TURNS, SETTING_RANGES, Param, TaskAPI, check_count, check_size,
                      checked_text, steering_asked)
from .running import SETTINGS as TASK_SETTINGS

MAX_CHOICES = 8  # n: each choice holds a decoding row until it is done
RETRY_AFTER_S = 5  # what a 429 or a 503 asks the client to wait
# OpenAI's name of a field -> the engine's setting, with OpenAI's default where it has one.
SETTINGS = {"temperature": ("temperature", 1.0), "top_p": ("top_p", 1.0), "max_tokens": ("max_new_tokens", 16),
            "max_completion_tokens": ("max_new_tokens", 16), "top_k": ("top_k", 0), "min_p": ("min_p", 0.0),
            "typical_p": ("typical_p", 1.0), "repetition_penalty": ("repetition_penalty", 1.0),
            "presence_penalty": ("presence_penalty", 0.0), "frequency_penalty": ("frequency_penalty", 0.0),
            "no_repeat_ngram_size": ("no_repeat_ngram_size", 0), "adapter_scale": ("adapter_scale", 1.0)}
INTEGER = {"top_k", "max_new_tokens", "no_repeat_ngram_size"}


@dataclass(frozen=True)
class Endpoint:
    """What OpenAI names differently in /v1/completions and /v1/chat/completions, and the task each
    runs under the bare model id."""
    chat: bool
    id_prefix: str  # an answer's id is PREFIX-hex
    answer_object: str  # the `object` of a whole answer
    chunk_object: str  # the `object` of a stream's chunk
    task: Task
    max_tokens: int  # the default of max_tokens under the bare model id


COMPLETIONS = Endpoint(chat=False, id_prefix="cmpl", answer_object="text_completion", chunk_object="text_completion",
                       task=TASKS["generate"], max_tokens=16)  # OpenAI's default
# OpenAI's chat has no default limit but the context; a reply here ends with its line, and the
# Chat tab's cap, chosen on the validation replies, stops one that rambles on.
CHAT_COMPLETIONS = Endpoint(chat=True, id_prefix="chatcmpl", answer_object="chat.completion",
                            chunk_object="chat.completion.chunk", task=TASKS["dialogue"],
                            max_tokens=TASKS["dialogue"].defaults.max_new_tokens)
# Each task's adapter is named after it: the task that `model:adapter` runs.
ADAPTER_TASKS = {task.adapter: task for task in TASKS.values() if task.adapter is not None}


class BadRequest(ValueError):
    """A request the API does not take: OpenAI's 400 (or `status`), naming the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code

    @classmethod
    def refusing(cls, error: ValueError, param: str | None) -> "BadRequest":
        """What the app's own checks refused, as a 400 that names the request's field."""
        return cls(english(message_of(error)), param=param)

    def error_object(self) -> dict:
        """OpenAI's error: a response's body, or a stream's last event."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        retry = {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}
        return JSONResponse(self.error_object(), status_code=self.status, headers=retry)


def openai_routes(host: ModelHost, api_key: str | None = None) -> APIRouter:
    """The /v1 routes for the models `host` serves, each run taking its turn in the host's queue
    as the page's do; with `api_key`, each request needs it as a bearer token."""
    router = APIRouter(prefix="/v1")
    started = int(time.time())
    # A run waits for its turn in a thread: enough of them that every run the queue holds has one,
    # and that a request past its capacity reaches it, to be refused, rather than waiting for a thread.
    threads = anyio.CapacityLimiter(host.queue.threads)

    def guarded(handler):
        async def handle(request: Request):
            if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
                response = BadRequest("a valid API key is needed: Authorization: Bearer KEY", status=401,
                                      kind="authentication_error", code="invalid_api_key").response()
            else:
                response = await answer(handler, request)
            # What a seed's text may depend on: the decode kernels and PyTorch's products round
            # differently (docs/api.md, "Seeds").
            response.headers["X-Decode-Path"] = host.current.decode_path
            return response
        return handle

    def model_object(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": started, "owned_by": "pre-ln-gpt2-studio"}

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [model_object(model_id) for model_id in model_ids(host)]})

    async def one_model(request: Request):
        model_id = request.path_params["model_id"]
        if model_id not in model_ids(host):
            raise not_served(host, model_id)
        return JSONResponse(model_object(model_id))

    async def completions(request: Request):
        body = await json_body(request)
        task, adapter = task_for(host, body, COMPLETIONS)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be text (one string)", param="prompt")
        api = TaskAPI(task, "v1/completions", (Param("prompt", str),),
                      make_inputs=lambda prompt: GenerateInputs(checked_text("prompt", prompt)), description="")
        return await respond(request, host, body, api, {"prompt": prompt}, adapter, COMPLETIONS, threads)

    async def chat_completions(request: Request):
        body = await json_body(request)
        task, adapter = task_for(host, body, CHAT_COMPLETIONS)
        inputs = chat_inputs(task, body)
        api = TaskAPI(task, "v1/chat/completions", (Param("inputs", task.inputs),),
                      make_inputs=lambda inputs: inputs, description="")
        return await respond(request, host, body, api, {"inputs": inputs}, adapter, CHAT_COMPLETIONS, threads)

    router.add_api_route("/models", guarded(models), methods=["GET"])
    router.add_api_route("/models/{model_id:path}", guarded(one_model), methods=["GET"])
    router.add_api_route("/completions", guarded(completions), methods=["POST"])
    router.add_api_route("/chat/completions", guarded(chat_completions), methods=["POST"])

    async def unknown(request: Request):
        raise BadRequest(f"no route {request.method} {request.url.path}: the API has GET /v1/models, "
                         "POST /v1/completions and POST /v1/chat/completions", status=404, code="unknown_url")
    # last, so that it answers only what no route above does, in OpenAI's shape rather than FastAPI's
    router.add_api_route("/{path:path}", guarded(unknown),
                         methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    return router


async def answer(handler, request: Request):
    try:
        return await handler(request)
    except BadRequest as refused:
        return refused.response()


def model_ids(host: ModelHost) -> list[str]:
    loaded = host.current
    return [loaded.name, *(f"{loaded.name}:{adapter}" for adapter in loaded.adapters)]


async def json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def task_for(host: ModelHost, body: dict, endpoint: Endpoint) -> tuple[Task, bool]:
    """The task a request runs, with the decoding defaults it takes where the request leaves a
    setting unset, and whether its adapter is on. The bare model id runs the endpoint's task with
    OpenAI's defaults. `name:adapter` switches that adapter on with its task's defaults (the tab's:
    Translate's repetition penalty, which stops its loops); a chat runs that task on the last user
    message (chat_inputs), a completion continues its prompt as written, in the adapter's format
    where the client writes it (docs/api.md)."""
    model = body.get("model")
    if model is None:
        raise BadRequest(f"model is required: one of {', '.join(model_ids(host))}", param="model")
    if host.loading is not None and str(model).split(":", 1)[0] == host.loading:
        raise BadRequest(f"the model {host.loading} is loading; please retry in a few seconds", param="model",
                         status=503, kind="server_error", code="model_loading")
    if model not in model_ids(host):
        raise not_served(host, model)
    adapter = model.split(":", 1)[1] if ":" in model else None
    adapters_task = ADAPTER_TASKS.get(adapter)  # None for the bare id, or an adapter of no task here
    task = adapters_task if endpoint.chat and adapters_task else endpoint.task
    if adapters_task:
        settings = {name: getattr(adapters_task.defaults, name) for name, _ in SETTINGS.values()}
    else:  # OpenAI's defaults, and the extra settings off, as the docs say, rather than the tab's
        settings = {**{name: default for name, default in SETTINGS.values()}, "max_new_tokens": endpoint.max_tokens}
    defaults = replace(task.defaults, **settings)
    return replace(task, defaults=defaults, adapter=adapter or task.adapter), adapter is not None


def not_served(host: ModelHost, model: Any) -> BadRequest:
    return BadRequest(f"the model {model!r} is not served here (it serves: {', '.join(model_ids(host))})",
                      param="model", status=404, code="model_not_found")


def stop_list(stop: Any) -> list[str]:
    """OpenAI's `stop` (one string, or a list of strings, each as it is) as the list the task's run
    takes (serve.running.asked_stops), which adds them to the task's own and checks them."""
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    return stops


def chat_inputs(task: Task, body: dict):
    """What a chat asks of its task: for dialogue, the conversation (dialogue_inputs); for the
    others (an adapter's id), the last user message is the text to summarise, or to translate from
    `source` to `target` (extra fields, named as /translate names them; English to French by
    default, since a chat client sends only the text)."""
    if task.inputs is DialogueInputs:
        return dialogue_inputs(body.get("messages"))
    text = conversation(body.get("messages"))[1][-1][0]
    if task.inputs is SummarizeInputs:
        return SummarizeInputs(checked_field("article", text, "messages"))
    source, target = body.get("source", "English"), body.get("target", "French")
    for field, language in (("source", source), ("target", target)):
        if language not in LANGUAGES:
            raise BadRequest(f"{field} must be one of {', '.join(LANGUAGES)}", param=field)
    return TranslateInputs(checked_field("text", text, "messages"), source, target)


def checked_field(name: str, value: str, param: str) -> str:
    """checked_text's refusal as a 400 naming the request's field `param`."""
    try:
        return checked_text(name, value)
    except ValueError as error:
        raise BadRequest.refusing(error, param) from None


def dialogue_inputs(messages: Any) -> DialogueInputs:
    """OpenAI's messages as the Chat tab's conversation: system messages make the persona, the
    user and assistant turns before the last user message its history."""
    persona, turns = conversation(messages)
    try:
        check_count("turns in history", len(turns) - 1, MAX_CHAT_TURNS)
        history = [(user, bot) for user, bot in turns[:-1]]
        check_size("history", sum(len(user) + len(bot) for user, bot in history), MAX_CHARS["history"])
        return DialogueInputs(checked_text("message", turns[-1][0]), history, checked_text("persona", " ".join(persona)))
    except ValueError as error:
        raise BadRequest.refusing(error, "messages") from None


def conversation(messages: Any) -> tuple[list[str], list[list[str]]]:
    """OpenAI's messages as the system messages' texts and the [user, assistant] turns, the last
    the user's alone; user messages in a row are one turn."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content}", param="messages")
    persona, turns = [], []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts: their text
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if role not in ("system", "developer", "user", "assistant") or not isinstance(content, str):
            raise BadRequest("each message must be {role: system|user|assistant, content: text}", param="messages")
        if role in ("system", "developer"):
            persona.append(content)
        elif role == "user" and turns and not turns[-1][1]:  # one turn, as a person sends it in pieces
            turns[-1][0] = f"{turns[-1][0]} {content}"
        elif role == "user":
            turns.append([content, ""])
        elif turns and not turns[-1][1]:
            turns[-1][1] = content
        else:
            turns.append(["", content])
    if not turns or turns[-1][1]:
        raise BadRequest("the last message must be the user's", param="messages")
    return persona, turns


def request_values(body: dict) -> dict[str, Any]:
    """The settings a request sends, checked field by field so that a refusal names its field."""
    values = {}
    for field, (name, _) in SETTINGS.items():
        value = body.get(field)
        if value is None:
            continue
        low, high = SETTING_RANGES[name]  # as the page takes them: max_tokens up to the app's 512
        try:
            values[name] = check_setting(name, value, low, high, integer=name in INTEGER)
            if name == "temperature":
                check_temperature(values[name])
        except Refusal as error:  # said with the request's own name of the field (max_tokens)
            named = error.message.with_fields(name=field) if error.message.field("name") == name else error.message
            raise BadRequest.refusing(Refusal.saying(named), field) from None
    seed = body.get("seed")
    if seed is not None:
        try:
            values["seed"] = check_setting("seed", seed, *LIMITS["seed"], integer=True)
        except ValueError as error:
            raise BadRequest.refusing(error, "seed") from None
    return values


STEERING_FIELDS = {"positive": "steer_positive", "negative": "steer_negative", "layer": "steer_layer",
                   "strength": "steer_strength"}


def steering_values(body: dict, config: GPT2Config) -> dict[str, Any]:
    """The body's `steering` ({positive, negative, layer, strength}, this app's own field) as the
    task's steering values, checked as the page checks them (serve.running.steering_asked); a 400
    naming `steering` where it is not that."""
    steering = body.get("steering")
    if steering is None:
        return {}
    if not isinstance(steering, dict) or not set(steering) <= set(STEERING_FIELDS):
        raise BadRequest("steering must be an object with positive, negative, layer and strength", param="steering")
    values = {STEERING_FIELDS[name]: value for name, value in steering.items()}
    try:
        steering_asked(values, config)
    except ValueError as error:
        raise BadRequest.refusing(error, "steering") from None
    return values


def logprobs_asked(body: dict, chat: bool) -> int:
    """How many alternatives each token reports (OpenAI: completions' logprobs 0-20; chat's
    logprobs: true with top_logprobs 0-20); -1: none asked."""
    if chat:
        if not body.get("logprobs"):
            return -1
        field, value = "top_logprobs", body.get("top_logprobs") or 0
    else:
        field, value = "logprobs", body.get("logprobs")
        if value is None:
            return -1
    try:
        return check_setting(field, value, 0, LIMITS["logprobs"][1], integer=True)
    except ValueError as error:
        raise BadRequest.refusing(error, field) from None


def choice_count(body: dict) -> int:
    try:
        return check_setting("n", body.get("n", 1), 1, MAX_CHOICES, integer=True)
    except ValueError as error:
        raise BadRequest.refusing(error, "n") from None


async def respond(request: Request, host: ModelHost, body: dict, api: TaskAPI, inputs: dict, adapter: bool,
                  endpoint: Endpoint, threads: anyio.CapacityLimiter):
    """The request's n runs, one after another (each takes its turn in the queue as it starts),
    streamed as server-sent events or answered at once when all have ended; run in `threads`."""
    settings = request_values(body)
    top = logprobs_asked(body, endpoint.chat)
    n = choice_count(body)
    echo = bool(body.get("echo")) and not endpoint.chat
    seed = settings.pop("seed", None)
    if seed is None:
        seed = int.from_bytes(uuid.uuid4().bytes[:4], "little")
    defaults = api.task.defaults
    base = {**{name: getattr(defaults, name) for name, _ in TASK_SETTINGS}, "stop": stop_list(body.get("stop")),
            # the engine's logprobs 0 is none at all: 1 gives each token's own, its alternatives cut to `top`
            **settings, **steering_values(body, host.current.config), **inputs, "adapter": adapter, "logprobs": max(top, 1) if top >= 0 else 0}
    values = [{**base, "seed": (seed + i) % (LIMITS["seed"][1] + 1)} for i in range(n)]
    headers = {"X-Seed": str(seed)}
    meta = {"id": f"{endpoint.id_prefix}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
            "model": body.get("model"), "system_fingerprint": f"seed-{seed}"}
    echoed = inputs["prompt"] if echo else ""
    if body.get("stream"):
        with_usage = usage_asked(body)
        first, runs = await anyio.to_thread.run_sync(start_runs, api, host, values, limiter=threads)
        return StreamingResponse(streamed(request, first, runs, endpoint, meta, top, echoed, threads, with_usage),
                                 media_type="text/event-stream", headers=headers)
    echoed_logprobs = (await anyio.to_thread.run_sync(prompt_logprobs, host, api, inputs["prompt"], base, top,
                                                      limiter=threads)
                       if echo and top >= 0 else [])
    finals = await anyio.to_thread.run_sync(lambda: [last_of(api, host, run_values) for run_values in values],
                                            limiter=threads)
    choices = []
    for index, (text, outcome, _, logprobs) in enumerate(finals):
        shared = dict(index=index, text=text, outcome=outcome, logprobs=logprobs, top=top)
        choices.append(chat_choice(**shared) if endpoint.chat
                       else completion_choice(**shared, echoed=echoed, echoed_logprobs=echoed_logprobs))
    outcomes = [outcome for _, outcome, _, _ in finals]
    return JSONResponse(counted_object(meta=meta, object_type=endpoint.answer_object, choices=choices,
                                       outcomes=outcomes), headers=headers)


def prompt_logprobs(host: ModelHost, api: TaskAPI, prompt: str, values: dict, top: int) -> list[dict]:
    """The echoed prompt's tokens with their log-probabilities (Result.logprobs' form), under the
    request's adapter and steering: what a harness reads to score a text. The prompt must fit whole
    beside max_tokens, since a cut one would score other tokens than it sent."""
    loaded = host.current
    ids = loaded.tokenizer.encode(prompt)
    n_ctx = loaded.context
    room = n_ctx - room_to_generate(n_ctx, values["max_new_tokens"])
    if len(ids) > room:
        raise BadRequest(f"prompt: {len(ids):,} tokens, but with echo and logprobs it must fit whole, and only "
                         f"{room:,} fit in the context next to max_tokens", param="prompt")
    adapter = api.task.adapter if values["adapter"] else None
    # a forward pass in a thread of its own, as every one outside the decode loop (serve.running)
    scale = values.get("adapter_scale", api.task.defaults.adapter_scale)
    steering, _ = steering_of(loaded, values)

    def traced():
        with steered(loaded.model, steering):
            return prompt_trace(loaded.model, ids, top, adapter, scale)
    trace = in_thread_of_its_own(traced)
    return token_logprobs(loaded.tokenizer, trace)


def usage_asked(body: dict) -> bool:
    """Whether a stream ends with a chunk of its token counts (OpenAI's stream_options)."""
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    return bool(options.get("include_usage"))


def usage(outcomes: list[Outcome]) -> dict:
    """OpenAI's usage of a request's choices: the prompt once, every choice's generated tokens."""
    prompt_tokens, generated = outcomes[0].prompt_tokens, sum(o.generated_tokens for o in outcomes)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated, "total_tokens": prompt_tokens + generated}


def last_of(api: TaskAPI, host: ModelHost, values: dict) -> tuple[str, Outcome, str, list]:
    """A run's last update, or its refusal as a BadRequest."""
    last = None
    for last in host.run(api, values):
        pass
    return checked_outcome(last)


def checked_outcome(update):
    text, outcome, prompt, logprobs = update
    if outcome is not None and not outcome.ran:
        if outcome.kind == REFUSED and outcome.message.key == QUEUE_FULL:  # the page's full queue too: come back
            raise BadRequest(english(outcome.message), status=429, kind="rate_limit_error", code=QUEUE_FULL)
        if outcome.kind == REFUSED:  # the field the message names, where it names one
            raise BadRequest(english(outcome.message), param=outcome.message.field("name"))
        raise BadRequest(english(outcome.message), status=500, kind="server_error")
    return update


def start_runs(api: TaskAPI, host: ModelHost, values: list[dict]):
    """The runs of a streamed request, each updating at every token as OpenAI's streams do (not at
    the page's pace), and the first update of the first (a refusal comes before any byte is sent,
    as a 400)."""
    runs = [host.run(api, run_values, per_token=True) for run_values in values]
    first = checked_outcome(next(runs[0]))
    return first, runs


async def streamed(request: Request, first, runs: list[Iterator], endpoint: Endpoint, meta: dict, top: int,
                   echoed: str, threads: anyio.CapacityLimiter, with_usage: bool = False):
    """Server-sent events: each choice's text, one chunk per decoded token that changes it (a token
    whose text is held back, as the start of a possible stop string or a reply's trailing space,
    goes in the chunk of the next token that shows), then a chunk with its finish_reason (and
    logprobs) and any text held back to the end (choices one after another, each after `echoed`,
    the prompt where it is echoed); then, with_usage, a chunk of no choices with the usage, then
    [DONE]. A client that leaves ends every run, freeing its decoding row."""
    outcomes = []
    try:
        for index, events in enumerate(runs):
            if echoed:  # only a completion echoes
                yield event(completion_chunk(meta=meta, index=index, text=echoed, outcome=None, logprobs=[], top=top))
            sent, update, opening = "", first if index == 0 else None, True
            while True:
                if update is None:
                    update = await anyio.to_thread.run_sync(next, events, None, limiter=threads)
                    if update is None:
                        break
                text, outcome, _, logprobs = checked_outcome(update)
                update = None
                if outcome is not None:
                    outcomes.append(outcome)
                delta = text[len(sent):] if text.startswith(sent) else ""
                if delta or outcome is not None:
                    sent = sent + delta
                    shared = dict(meta=meta, index=index, text=delta, outcome=outcome, logprobs=logprobs, top=top)
                    yield event(chat_chunk(**shared, opening=opening) if endpoint.chat else completion_chunk(**shared))
                    opening = False
                if await request.is_disconnected():
                    return
        if with_usage:
            yield event(counted_object(meta=meta, object_type=endpoint.chunk_object, choices=[], outcomes=outcomes))
        yield "data: [DONE]\n\n"
    except BadRequest as failed:
        yield error_event(failed)
    finally:
        with anyio.CancelScope(shield=True):  # a client gone cancels this task: the runs must close all the same
            for events in runs:
                await anyio.to_thread.run_sync(events.close, limiter=threads)


def event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_event(error: BadRequest) -> str:
    """A stream's last event where it cannot end with its finish_reason and [DONE]: OpenAI's error
    shape, which the `openai` client raises as an APIError."""
    return event(error.error_object())


def replica_stopped(message: Message) -> BadRequest:
    """What a deployment's ingress (serve/cluster.py) says where the replica serving a request
    stopped or failed (`message` says which): a 503 while nothing was sent, or, through
    error_event, a stream's last event."""
    return BadRequest(english(message), status=503, kind="server_error", code="replica_stopped")


def finish_reason(outcome: Outcome) -> str:
    """OpenAI's: "length" where the token budget ran out, "stop" for every other end."""
    return "length" if outcome.stop_reason in ("max_tokens", "context_full") else "stop"


def completion_logprobs(entries: list[dict], top: int, start: int = 0) -> dict:
    """OpenAI's completions logprobs: tokens, their log-probabilities, each one's top alternatives
    (None for a prompt's first token, which has no log-probability), and where each token starts
    in the text (from `start`)."""
    offsets, at = [], start
    for entry in entries:
        offsets.append(at)
        at += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None if e["logprob"] is None else {alt["token"]: alt["logprob"] for alt in e["top"][:top]}
                             for e in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[dict], top: int) -> dict:
    def one(entry: dict) -> dict:
        return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}
    return {"content": [{**one(e), "top_logprobs": [one(alt) for alt in e["top"][:top]]} for e in entries]}


def counted_object(*, meta: dict, object_type: str, choices: list[dict], outcomes: list[Outcome]) -> dict:
    """A whole answer, or a stream's usage chunk (of no choices): its choices and their usage."""
    return {**meta, "object": object_type, "choices": choices, "usage": usage(outcomes)}


def completion_choice(*, index: int, text: str, outcome: Outcome, logprobs: list, top: int, echoed: str,
                      echoed_logprobs: list) -> dict:
    """A completion's choice; `echoed`, the prompt comes first, and so do its tokens' logprobs."""
    if top < 0:
        return {"index": index, "text": echoed + text, "finish_reason": finish_reason(outcome), "logprobs": None}
    # each part's offsets counted from where it starts: a token that is a piece of a character
    # shows as U+FFFD, so the prompt's token texts need not add up to its length
    parts = [completion_logprobs(echoed_logprobs, top), completion_logprobs(logprobs, top, len(echoed))]
    return {"index": index, "text": echoed + text, "finish_reason": finish_reason(outcome),
            "logprobs": {key: parts[0][key] + parts[1][key] for key in parts[1]}}


def chat_choice(*, index: int, text: str, outcome: Outcome, logprobs: list, top: int) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason(outcome), "logprobs": chat_logprobs(logprobs, top) if top >= 0 else None}


def completion_chunk(*, meta: dict, index: int, text: str, outcome: Outcome | None, logprobs: list,
                     top: int) -> dict:
    """A completion stream's chunk: a choice's new text; the last, with the run's outcome, also
    its finish_reason and logprobs."""
    return {**meta, "object": COMPLETIONS.chunk_object,
            "choices": [{"index": index, "text": text, "finish_reason": finish_reason(outcome) if outcome else None,
                         "logprobs": completion_logprobs(logprobs, top) if outcome and top >= 0 else None}]}


def chat_chunk(*, meta: dict, index: int, text: str, outcome: Outcome | None, logprobs: list, top: int,
               opening: bool) -> dict:
    """A chat stream's chunk, as completion_chunk's; the role in a choice's first (`opening`) only,
    as OpenAI sends it: clients that join the deltas' fields would otherwise repeat it."""
    role = {"role": "assistant"} if opening else {}
    return {**meta, "object": CHAT_COMPLETIONS.chunk_object,
            "choices": [{"index": index, "delta": {**role, "content": text},
                         "finish_reason": finish_reason(outcome) if outcome else None,
                         "logprobs": chat_logprobs(logprobs, top) if outcome and top >= 0 else None}]}

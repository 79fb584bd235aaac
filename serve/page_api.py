"""What a page in front needs from a replica on another machine (serve/cluster.py), over HTTP: the
model's description, each task run as a stream of updates ending in its outcome record, the
comparison of two sides (serve/comparing.py), the Architecture tab's look inside and trace, and a
steering vector to export. serve/backend.py is the other end. The Gradio page and its API send their
work here with `python app.py --backend URL`.

    GET  /studio/model                 the model: name, adapters, config, the model line
    POST /studio/run/{api_name}        the task's values -> NDJSON: {text, outcome, prompt, logprobs}
    POST /studio/compare/{api_name}    the same with "compare" (what differs) -> NDJSON: {texts, outcome,
                                       comparison}; values left out take the task's defaults
    POST /studio/look_inside           {prompt, layer, head, adapter} -> the live view
    POST /studio/trace                 {clean, corrupted, answer, noise_span} -> the trace (serve/tracing.py)
    POST /studio/steering              a task's steer_* values -> the steering vector (serve/vectors.py)

A client that closes a stream ends its run and frees its decoding row, as in the app.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterator

import anyio
import torch
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .apis import APIS
from .comparing import Comparison
from .host import Host
from .inspection import Inspection, LogitLens
from .messages import Message, message_of
from .outcome import FAULT, Outcome
from .running import LiveView
from .tracing import Trace
from .vectors import SteeringVector

PREFIX = "/studio"


def page_routes(host: Host, api_key: str | None = None) -> APIRouter:
    """The routes for a page in front of `host`; with `api_key`, each needs it as a bearer token."""
    def key_checked(request: Request) -> None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            raise HTTPException(401, "a valid API key is needed: Authorization: Bearer KEY")

    router = APIRouter(prefix=PREFIX, dependencies=[Depends(key_checked)])

    async def model(request: Request):
        loaded = host.current
        return JSONResponse({"name": loaded.name, "adapters": loaded.adapters, "adapters_on": loaded.adapters_on,
                             "config": dataclasses.asdict(loaded.config), "decode_path": loaded.decode_path,
                             "line": {lang: loaded.describe(lang) for lang in ("en", "zh")}})

    def streamed_route(runner: Callable, fields: tuple[str, ...]):
        """A route that streams `runner`'s updates (the host's run or run_compare) for the task
        named in its path, as JSON lines of `fields`, a record (the outcome, the comparison) as its JSON."""
        async def route(api_name: str, request: Request):
            api, values = APIS.get(api_name), await request.json()
            if api is None:
                return JSONResponse({"error": f"no task {api_name!r}"}, status_code=404)
            updates = ({name: value.as_json() if hasattr(value, "as_json") else value
                        for name, value in zip(fields, update)} for update in runner(api, values))
            return StreamingResponse(lines(request, updates), media_type="application/x-ndjson")
        return route

    def answered(work: Callable[[dict], Any], as_json: Callable[[Any], dict]):
        """A route that answers the JSON it is sent with `work`'s record as JSON, or a refusal (400)."""
        async def route(request: Request):
            asked = await request.json()
            try:
                record = await anyio.to_thread.run_sync(lambda: work(asked))
            except ValueError as error:
                return JSONResponse({"refused": dataclasses.asdict(message_of(error))}, status_code=400)
            return JSONResponse(as_json(record))
        return route

    inside = answered(lambda asked: host.look_inside(asked.get("prompt"), asked.get("layer"), asked.get("head"),
                                                     asked.get("adapter")), view_as_json)
    trace = answered(lambda asked: host.trace(asked.get("clean"), asked.get("corrupted", ""), asked.get("answer", ""),
                                              asked.get("noise_span", "")), Trace.as_json)

    router.add_api_route("/model", model, methods=["GET"])
    router.add_api_route("/run/{api_name}", streamed_route(host.run, ("text", "outcome", "prompt", "logprobs")),
                         methods=["POST"])
    router.add_api_route("/compare/{api_name}", streamed_route(host.run_compare, ("texts", "outcome", "comparison")),
                         methods=["POST"])
    router.add_api_route("/look_inside", inside, methods=["POST"])
    router.add_api_route("/trace", trace, methods=["POST"])
    router.add_api_route("/steering", answered(host.steering_vector, SteeringVector.as_json), methods=["POST"])
    return router


async def lines(request: Request, updates: Iterator[dict]):
    """The updates as JSON lines, each as it comes; a client that leaves closes the run."""
    try:
        while (update := await anyio.to_thread.run_sync(next, updates, None)) is not None:
            yield json.dumps(update, ensure_ascii=False) + "\n"
            if await request.is_disconnected():
                return
    finally:
        with anyio.CancelScope(shield=True):  # a client gone cancels this task: the run must close all the same
            await anyio.to_thread.run_sync(updates.close)


def cut_line(last: dict | None, message: Message) -> str:
    """A stream's last line where its replica stopped before its outcome (a deployment's ingress
    writes it, serve/cluster.py): the update it sent last, its text so far, with a fault's outcome
    that says what happened."""
    return json.dumps({**(last or {}), "outcome": Outcome(FAULT, message).as_json()}, ensure_ascii=False) + "\n"


def view_as_json(view: LiveView) -> dict:
    def plain(record) -> dict:
        return {key: value.tolist() if isinstance(value, torch.Tensor) else value
                for key, value in dataclasses.asdict(record).items()}
    # (not dataclasses.asdict(view): it would deep-copy every tensor only for them to be replaced)
    return {"model": view.model, "layers": view.layers, "heads": view.heads, "seen": plain(view.seen),
            "lens": plain(view.lens)}


def view_from_json(data: dict) -> LiveView:
    seen, lens = data["seen"], data["lens"]
    seen = Inspection(**{**seen, "residual_norms": torch.tensor(seen["residual_norms"]),
                         "attention": torch.tensor(seen["attention"]),
                         "top_tokens": [tuple(pair) for pair in seen["top_tokens"]]})
    lens = LogitLens(**{**lens, "probabilities": torch.tensor(lens["probabilities"]),
                        "changed": None if lens["changed"] is None else torch.tensor(lens["changed"])})
    return LiveView(data["model"], data["layers"], data["heads"], seen, lens)


def update_from_json(update: dict) -> dict[str, Any]:
    """A streamed update with its outcome (and a comparison's record) as the records again."""
    outcome, comparison = update.get("outcome"), update.get("comparison")
    return {**update, "outcome": None if outcome is None else Outcome.from_json(outcome),
            "comparison": None if comparison is None else Comparison.from_json(comparison)}

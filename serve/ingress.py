"""A deployment's ingress: each HTTP request forwarded to a replica of the model, its answer sent
back, and what the client gets where that replica stops. serve/cluster.py runs it under Ray Serve
(the ingress deployment calls the model's through a DeploymentHandle); nothing here needs Ray, so
the tests also run it with replicas that stop on cue.

The two ends of a forwarded request:
- `answered(app, asked)`, on a replica: the request (method, path, query string, headers, body)
  answered by the replica's own HTTP app (serve/replica.py), as its response's start ({"status",
  "headers"}) and then its body, a piece at a time as the app sends it;
- `Forwarder`, the ingress's ASGI app: sends the request to a replica (`call`) and the pieces on
  to the client. A replica that stops (`gone`: what the caller raises then) before the first piece
  has come, when the client has been sent nothing, is given the request again, on another replica,
  with the same seed (seeded), so the client only waits longer (X-Retries says how often); one
  that stops after ends the answer with what says so (ending): OpenAI's error event on /v1's
  streams, an outcome record of the fault on /studio's. Nothing ends as if it were whole.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Callable

from engine.generate import resolve_seed

from .messages import Message
from .openai_api import error_event, replica_stopped
from .page_api import PREFIX as STUDIO, cut_line
from .running import asks_random_seed

RETRIES = 3  # other replicas a request that has sent nothing is sent to before it is given up (a 503)
RETRY_PAUSE_S = 0.5  # before each: the router hears of the dead replica
SSE, LINES = "text/event-stream", "application/x-ndjson"  # the answers sent a piece at a time
REPLICA_LOST = Message.keyed("replica_lost")
log = logging.getLogger(__name__)


def replicas_lost(tries: int) -> Message:
    return Message.keyed("replicas_lost", tries=tries)


def replica_failed(error: BaseException) -> Message:
    return Message.keyed("replica_failed", kind=type(error).__name__)


async def answered(app, asked: dict) -> AsyncIterator[dict | bytes]:
    """`asked` (its method, path, query_string, headers and body) answered by the ASGI `app`: the
    response's start ({"status", "headers"}), then its body a piece at a time as the app sends it.
    Closing this early (the client gone) is, for the app, its client leaving: a streamed run ends
    and frees its decoding row."""
    sent: asyncio.Queue = asyncio.Queue()
    left = asyncio.Event()
    requested = False

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": asked["body"], "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.put_nowait(message)

    def ended(task: asyncio.Task) -> None:
        sent.put_nowait(None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s %s failed: %r", asked["method"], asked["path"], task.exception())

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
             "method": asked["method"], "path": asked["path"], "raw_path": asked["path"].encode(), "root_path": "",
             "query_string": asked["query_string"], "headers": asked["headers"], "client": None, "server": None}
    answering = asyncio.ensure_future(app(scope, receive, send))
    answering.add_done_callback(ended)
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield {"status": message["status"], "headers": message.get("headers", [])}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    return
        raise RuntimeError(f"{asked['path']} ended without its response")
    finally:
        left.set()


class Forwarder:
    """The ingress's ASGI app. `call(asked)` sends a request to a replica and gives its answer as
    an async iterator of answered's pieces, with cancel() (the replica then ends the request);
    `gone` is what iterating it raises where the replica has stopped."""

    def __init__(self, call: Callable[[dict], AsyncIterator], gone: tuple[type[BaseException], ...],
                 retries: int = RETRIES, pause_s: float = RETRY_PAUSE_S):
        self.call, self.gone, self.retries, self.pause_s = call, gone, retries, pause_s

    async def __call__(self, scope, receive, send) -> None:
        asked = {"method": scope["method"], "path": scope["path"], "query_string": scope["query_string"],
                 "headers": scope["headers"], "body": seeded(scope["path"], await body_of(receive))}
        where = f"{scope['method']} {scope['path']}"
        for retries in range(self.retries + 1):
            if retries:
                await asyncio.sleep(self.pause_s)
            answer = self.call(asked)
            try:
                start = await anext(answer)
                first = await anext(answer, None)  # nothing has gone to the client until this has come
            except self.gone as gone:
                log.warning("%s: its replica stopped before answering (%s); try %d of %d", where,
                            type(gone).__name__, retries + 1, self.retries + 1)
                continue
            except Exception as failed:  # a fault in the replica, not its death: not sent again
                log.error("%s failed: %r", where, failed)
                return await replica_stopped(replica_failed(failed)).response()(scope, receive, send)
            except BaseException:  # the client gone: the replica ends the request and frees its rows
                answer.cancel()
                raise
            break
        else:
            return await replica_stopped(replicas_lost(self.retries + 1)).response()(scope, receive, send)
        await self.stream(where, answer, start, first, retries, send)

    async def stream(self, where: str, answer, start: dict, first: bytes | None, retries: int, send) -> None:
        """The replica's answer, from its `first` piece on, with X-Retries; where the replica stops
        in the middle of it, the ending that says so."""
        await send({"type": "http.response.start", "status": start["status"],
                    "headers": [*start["headers"], (b"x-retries", str(retries).encode())]})
        kind = next((value.decode() for name, value in start["headers"] if name.lower() == b"content-type"), "")
        last, piece = b"", first
        try:
            while piece is not None:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                last = last_line(last + piece)
                piece = await anext(answer, None)
        except Exception as failed:  # the answer has begun: it ends saying why, never as if it were whole
            log.warning("%s: its replica stopped in the middle of its answer (%r)", where, failed)
            why = REPLICA_LOST if isinstance(failed, self.gone) else replica_failed(failed)
            await send({"type": "http.response.body", "body": ending(kind, last, why), "more_body": True})
        finally:
            answer.cancel()  # (a no-op once it has ended; the client gone, the replica ends the request)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def body_of(receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body


def seeded(path: str, body: bytes) -> bytes:
    """The request's body with a seed drawn here where it leaves the seed to chance: a retry on
    another replica then draws the same text, and the answer reports the seed as ever. /v1 takes
    a missing or null seed as random (-1 is refused there); a /studio run also takes -1."""
    studio = path.startswith((f"{STUDIO}/run/", f"{STUDIO}/compare/"))
    if not (studio or path in ("/v1/completions", "/v1/chat/completions")):
        return body
    try:
        asked = json.loads(body)
    except ValueError:
        return body  # the replica refuses it, as it refuses it alone
    if not isinstance(asked, dict):
        return body
    seed = asked.get("seed")
    if not (asks_random_seed(seed) if studio else seed is None):
        return body
    return json.dumps({**asked, "seed": resolve_seed(None)}).encode()


def last_line(data: bytes) -> bytes:
    """Of what a stream has sent so far, its last whole line (with its end) and what came after."""
    whole, end, rest = data.rpartition(b"\n")
    return whole.rpartition(b"\n")[2] + end + rest


def ending(kind: str, last: bytes, why: Message) -> bytes:
    """What ends an answer of content type `kind` whose replica stopped in the middle of it (`last`:
    last_line of what it sent): on /v1's streams (server-sent events), OpenAI's error event; on
    /studio's (JSON lines), the last update again, its text so far, with a fault's outcome."""
    if kind.startswith(SSE):
        return error_event(replica_stopped(why)).encode()
    if kind.startswith(LINES):
        whole, end, rest = last.rpartition(b"\n")
        return (b"\n" if rest else b"") + cut_line(json.loads(whole) if end else None, why).encode()
    return b""

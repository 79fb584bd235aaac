"""A deployment's ingress (serve/ingress.py) without Ray: requests forwarded to replicas of the tests
that answer with a replica's own app (serve/replica.py) and stop on cue. A replica that stops before
it has answered: the next answers with the same seed (drawn at the ingress where the request left
it to chance), X-Retries says so; one that stops in the middle of a stream: the stream ends with
OpenAI's error event on /v1, a fault's outcome record on /studio, never as if it were whole; every
replica gone: a 503 in OpenAI's shape. (tests/test_cluster.py kills real replicas under Ray.)"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from serve import ingress
from serve.ingress import Forwarder, answered, ending, last_line, seeded
from serve.messages import Message
from serve.model_host import ModelHost
from serve.replica import replica_app

from .conftest import values_for


class Gone(Exception):
    """What the caller of a replica of the tests raises once the replica has stopped."""


class Replica:
    """Calls to a replica of the tests: each answered by `app`, and stopped (Gone, or `error`) once
    `pieces` pieces of it (the response's start first) have come, where given."""

    def __init__(self, app, pieces: int | None = None, error: Exception | None = None):
        self.app, self.pieces, self.error, self.asked = app, pieces, error or Gone(), []

    def __call__(self, asked: dict) -> "Answer":
        self.asked.append(asked)
        return Answer(answered(self.app, asked), self.pieces, self.error)


class Answer:
    def __init__(self, pieces, stops_after: int | None, error: Exception):
        self.pieces, self.left, self.error = pieces, stops_after, error

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.left == 0:
            raise self.error
        if self.left is not None:
            self.left -= 1
        return await anext(self.pieces)

    def cancel(self) -> None:
        asyncio.ensure_future(self.pieces.aclose())


def forwarder(*replicas: Replica) -> Forwarder:
    """An ingress that sends each try to the next of `replicas` (the last one again and again)."""
    tries = iter(replicas)
    last = replicas[-1]
    return Forwarder(lambda asked: next(tries, last)(asked), gone=(Gone,), pause_s=0)


def post(app, path: str, body: dict) -> httpx.Response:
    async def send():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingress") as client:
            return await client.post(path, json=body, timeout=60)
    return asyncio.run(send())


@pytest.fixture(scope="module")
def app(app_models):
    """One replica's app (its model in this process)."""
    return replica_app(ModelHost([app_models[0]], device="cpu"), "r1")


def events(response: httpx.Response) -> list:
    return [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]


def sse_text(response: httpx.Response) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events(response) if e != "[DONE]"
                   and "choices" in json.loads(e))


def test_a_request_whose_replica_stops_before_answering_is_answered_by_the_next_with_the_same_seed(app, app_models):
    model = app_models[0]
    for path, body, text_of, seed_of in [
            ("/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 12},
             lambda r: r.json()["choices"][0]["text"], lambda r: int(r.headers["x-seed"])),
            ("/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 12, "stream": True},
             sse_text, lambda r: int(r.headers["x-seed"])),
            ("/studio/run/generate", values_for("generate", prompt="Once upon a time", max_new_tokens=12, seed=-1),
             lambda r: json.loads(r.text.splitlines()[-1])["text"],
             lambda r: json.loads(r.text.splitlines()[-1])["outcome"]["seed"])]:
        # the first stops at once, the second once it has sent its response's start: neither sent a byte on
        first, second, third = Replica(app, pieces=0), Replica(app, pieces=1), Replica(app)
        response = post(forwarder(first, second, third), path, body)
        assert response.status_code == 200 and response.headers["x-retries"] == "2"
        sent = [json.loads(replica.asked[0]["body"]) for replica in (first, second, third)]
        assert sent[0] == sent[1] == sent[2] and sent[0]["seed"] not in (None, -1)  # drawn once, at the ingress
        alone = post(forwarder(Replica(app)), path, {**body, "seed": sent[0]["seed"]})
        assert seed_of(response) == sent[0]["seed"] and text_of(response) == text_of(alone) and text_of(alone)
        assert alone.headers["x-retries"] == "0"


def test_a_stream_whose_replica_stops_midway_ends_saying_so_never_as_if_whole(app, app_models):
    body = {"model": app_models[0], "prompt": "Once upon a time", "max_tokens": 40, "seed": 3, "stream": True}
    whole = events(post(forwarder(Replica(app)), "/v1/completions", body))
    assert whole[-1] == "[DONE]" and json.loads(whole[-2])["choices"][0]["finish_reason"]
    cut = events(post(forwarder(Replica(app, pieces=4)), "/v1/completions", body))
    assert [json.loads(e)["choices"] for e in cut[:3]] == [json.loads(e)["choices"] for e in whole[:3]]
    # (the response's start, then three chunks)
    assert json.loads(cut[-1]) == {"error": {
        "message": "the replica serving this request stopped in the middle of its answer; please retry",
        "type": "server_error", "param": None, "code": "replica_stopped"}}
    assert len(cut) == 4
    failed = events(post(forwarder(Replica(app, pieces=2, error=RuntimeError("x"))), "/v1/completions", body))
    assert json.loads(failed[-1])["error"]["message"] == "the replica serving this request failed (RuntimeError); " \
                                                         "please retry"
    # /studio: the last update again, its text so far, with a fault's outcome that says what happened
    values = values_for("generate", prompt="Once upon a time", max_new_tokens=200, seed=3)
    lines = [json.loads(line) for line in post(forwarder(Replica(app, pieces=3)), "/studio/run/generate",
                                                values).text.splitlines()]
    assert len(lines) == 3 and lines[-1]["text"] == lines[-2]["text"] and lines[-1]["prompt"] == lines[-2]["prompt"]
    assert lines[-1]["outcome"]["kind"] == "fault" and lines[-1]["outcome"]["message"] == {
        "key": "replica_lost", "fields": []}


def test_a_request_no_replica_answers_is_a_503_in_openai_shape(app, app_models):
    replica = Replica(app, pieces=0)
    response = post(forwarder(replica), "/v1/completions", {"model": app_models[0], "prompt": "Hi", "stream": True})
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"] == {
        "message": f"the replicas tried for this request ({ingress.RETRIES + 1}) stopped before answering; please retry",
        "type": "server_error", "param": None, "code": "replica_stopped"}
    assert len(replica.asked) == ingress.RETRIES + 1


def test_the_ingress_draws_a_seed_only_where_the_request_leaves_it_to_chance():
    def seed(path: str, body) -> object:
        return json.loads(seeded(path, json.dumps(body).encode())).get("seed")
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert isinstance(seed(path, {"prompt": "x"}), int) and isinstance(seed(path, {"seed": None}), int)
        assert seed(path, {"seed": 5}) == 5 and seed(path, {"seed": -1}) == -1  # (-1: /v1 refuses it)
    for path in ("/studio/run/generate", "/studio/compare/chat"):
        assert isinstance(seed(path, {"seed": -1}), int) and seed(path, {"seed": -1}) != -1
        assert seed(path, {"seed": 7}) == 7
    assert seeded("/v1/completions", b"not json") == b"not json"
    assert seeded("/studio/model", b"") == b"" and seed("/studio/look_inside", {"prompt": "x"}) is None


def test_a_stream_cut_inside_a_line_ends_that_line_before_its_own():
    why = Message.keyed("replica_lost")
    assert last_line(b'{"a": 1}\n{"b": 2}\n{"c"') == b'{"b": 2}\n{"c"'
    assert last_line(b'{"a": 1}\n') == b'{"a": 1}\n' and last_line(b'{"a"') == b'{"a"'
    cut = ending("application/x-ndjson", b'{"text": "Hi"}\n{"te', why).decode()
    assert cut.startswith("\n") and json.loads(cut.splitlines()[-1])["text"] == "Hi"
    assert json.loads(ending("application/x-ndjson", b'{"te', why))["outcome"]["kind"] == "fault"
    assert ending("application/json", b"{}", why) == b""

"""Load and fuzz: N concurrent gradio_client users on every endpoint of the app, for S seconds.

    python -m bench.load [--clients N] [--seconds S] [--warm-up S] [--json PATH] [--seed N]
                         [--url URL [--pid PID] | --model NAME --device D]

With --url it drives an app already running on loopback, or a deployment of replicas
(`python -m serve.cluster`, which has no Gradio: then every request goes through /v1); without,
it starts `python app.py` on a free loopback port (the bundled model unless --model) and stops it
at the end.

Each user loops until the time is up, picking one of:
- a *replay*: one of a fixed set of seeded or greedy requests whose answer was taken alone, one
  request at a time, before the run. Under load it must come back the same, word for word: a
  row of the decode batch handed to the wrong request would show here;
- a *fresh* request: random valid settings and a marker of its own in its text, which must come
  back in its prompt sent, with its own seed in its status line;
- an *invalid* request: out of range, too long, the wrong type; it must be refused with the
  message that says why;
- a replay or fresh request *cancelled* (gradio_client's Job.cancel) at a random moment, half
  of them while still waiting in the queue, half while their text streams in.

A share of each user's requests (V1_SHARE) goes through OpenAI's /v1 API on the same server
instead, with the same kinds: replays (streamed or not, against their own solo answers), fresh
requests (the prompt echoed with its marker, the seed in system_fingerprint), invalid ones (a 400
naming the field in `param`, a 404 for an unknown model) and streams cancelled by closing the
connection, before their first text or while it streams.

The solo answers are taken once the app's decode path has settled (the kernels built, or known
not to be): the two paths round differently, so a seed's text is checked on the path it came from
(docs/api.md, "Seeds").

Before the measured run the users run the same mix for --warm-up seconds, so that every path
(long prompts, adapters, refusals, cancels) has been through the app when its memory is read.

Prints requests done, errors by kind (every one must be explained: a validation message, a
cancel, or a full queue), p50/p95 latency to the first streamed text (overall, by endpoint, and
for the page's Gradio endpoints beside /v1, which share one queue), tokens/s over all users,
the app's resident memory after warm-up and at the end (psutil, on the server's pid), and how
many outputs came back crossed between users. --json writes the same as numbers.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil
from gradio_client import Client

from app import VIEWS
from engine.generate import MAX_SEED
from engine.kernels import BUILDING
from serve.running import MAX_CHARS, MAX_CHAT_TURNS, MAX_EXAMPLE_PAIRS, MAX_NEW_TOKENS, SAID_AS
from ui.tabs.summarise import ANT_AND_DOVE, FOX_AND_CROW

REPO = Path(__file__).resolve().parent.parent
ANSWER_TIMEOUT_S = 300  # a request not answered by then counts as an unexplained failure
POLL_S = 0.01  # how often a user looks at its job (Job's own iterator spins every millisecond)
STATUS = re.compile(r"^seed (\d+) · (\d+) prompt \+ (\d+) generated tokens")

# Seeded or greedy: each must give the same text whoever else is being served at the time.
REPLAYS = [
    ("/generate", dict(prompt="Once upon a time, there was a little fox who", max_new_tokens=48, seed=11)),
    ("/generate", dict(prompt="The old king called his three sons and said,", temperature=0, max_new_tokens=40)),
    ("/generate", dict(prompt="Lily looked out of the window and saw", top_k=0, top_p=0.9, repetition_penalty=1.2,
                       max_new_tokens=40, seed=12)),
    ("/chat", dict(message="Can you tell me a story about a brave mouse?", persona="Bot is a kind storyteller.",
                   seed=13)),
    ("/chat", dict(message="And then what happened?", history=[["Hello!", "Hello, how are you?"]], seed=14,
                   adapter=True)),
    ("/translate", dict(text="The cat is sleeping on the chair.", target="French")),
    ("/translate", dict(text="I like to read books in the evening.", target="German", adapter=True)),
    ("/summarize", dict(article=FOX_AND_CROW, seed=15)),
    ("/summarize", dict(article=ANT_AND_DOVE, seed=16, adapter=True)),
]
TEXT_FIELD = {"/generate": "prompt", "/chat": "message", "/translate": "text", "/summarize": "article"}
FRESH_TEXT = {"/generate": "Once upon a time, {marker} went to the market and",
              "/chat": "Hello {marker}, what did you do today?",
              "/translate": "My friend {marker} is reading a book.",
              "/summarize": "{marker} found a small bird in the garden. It could not fly. She fed it every day, "
                            "and after a week it flew away singing."}


# What the app must refuse, and the message that must say why: (endpoint, request, message). The
# wording is kept here alone: tests/test_hardening.py sends TOO_LONG and OUT_OF_RANGE as well.
BASE = {"/generate": dict(prompt="Hello"), "/chat": dict(message="Hi"), "/translate": dict(text="Hello"),
        "/summarize": dict(article="A story.")}


APIS = {f"/{view.api.name}": view.api for view in VIEWS.values()}  # each endpoint's parameters


def refused(field: str, value, message: str) -> tuple[str, dict, str]:
    """The endpoint that takes `field`, a request to it that is good but for `field` = value, and
    the message its refusal must say."""
    api_name = next(name for name, api in APIS.items() if field in api.signature.parameters)
    return api_name, {**BASE[api_name], field: value}, message


TURN = ["How are you?", "I am well, thank you."]
TOO_LONG = [  # every input's limit, of characters and of counts: the message names the field and the limit
    *(refused(field, "x" * (limit + 1),
              f"{SAID_AS.get(field, field)} is too long: {limit + 1:,} characters; the limit is {limit:,}")
      for field, limit in MAX_CHARS.items() if field != "history"),
    refused("history", [TURN] * (MAX_CHAT_TURNS + 1),
            f"too many turns in history: {MAX_CHAT_TURNS + 1}; the limit is {MAX_CHAT_TURNS}"),
    refused("history", [["x" * 2000, "y" * 2000]] * 26,
            f"history is too long: 104,000 characters; the limit is {MAX_CHARS['history']:,}"),
    refused("examples", "\n".join(["cat = chat"] * (MAX_EXAMPLE_PAIRS + 1)),
            f"too many example pairs: {MAX_EXAMPLE_PAIRS + 1}; the limit is {MAX_EXAMPLE_PAIRS}"),
]
OUT_OF_RANGE = [  # settings: the message names the range and what came, cut short however big
    ("/generate", dict(prompt="Hello", temperature=99), "temperature must be between 0.0 and 5.0, got 99"),
    ("/generate", dict(prompt="Hello", temperature=1e-300),
     "temperature must be 0 (greedy) or at least 0.01, got 1e-300"),
    ("/generate", dict(prompt="Hello", max_new_tokens=MAX_NEW_TOKENS + 1),
     f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {MAX_NEW_TOKENS + 1}"),
    ("/generate", dict(prompt="Hello", max_new_tokens=10**30),
     f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got {10**30}"),
    ("/generate", dict(prompt="Hello", top_p=-1.5), "top_p must be between 0.01 and 1.0, got -1.5"),
    ("/generate", dict(prompt="Hello", top_k=-(10**400)),
     "top_k must be between 0 and 1,000, got an integer of 1329 bits"),
    ("/generate", dict(prompt="Hello", repetition_penalty="x" * 100_000),
     "repetition_penalty must be a number, got 'xxxx"),
    ("/generate", dict(prompt="Hello", seed=MAX_SEED + 1),
     f"seed must be between 0 and {MAX_SEED:,}, got {MAX_SEED + 1}"),
    ("/summarize", dict(article="Hello.", adapter="yes"), "adapter must be true or false, got 'yes'"),
    ("/chat", dict(message="Hi", top_k="many"), "top_k must be an integer, got 'many'"),
    ("/summarize", dict(article="A story.", seed=-5), f"seed must be between 0 and {MAX_SEED:,}, got -5"),
    ("/summarize", dict(article="A story.", no_repeat_ngram_size=2.5),
     "no_repeat_ngram_size must be an integer, got 2.5"),
]
MALFORMED = [
    ("/generate", dict(prompt="   "), "prompt is empty"),
    ("/chat", dict(message="Hi", history=[["only the user"]]), "history must be a list of [user, bot] pairs"),
    ("/translate", dict(text="Hello", target="English"), "cannot translate English to English"),
    ("/translate", dict(text="Hello", examples="no equals sign"), "example pairs line 1 is not"),
    ("/summarize", dict(article=42), "article must be text"),
]
INVALID = [*TOO_LONG, *OUT_OF_RANGE, *MALFORMED]
MIX = {"replay": 0.35, "fresh": 0.3, "invalid": 0.2, "cancel": 0.15}
CANCEL_WITHIN_S = 1.0  # a cancel comes this long at most after the submit, or after the first streamed text
CANCELLED_WAITING, CANCELLED_STREAMING = "cancelled before its first text", "cancelled while streaming"


@dataclass
class Outcome:
    api_name: str
    kind: str  # "completed", CANCELLED_WAITING, CANCELLED_STREAMING, or the error's kind
    explained: bool = True
    ttft_s: float | None = None
    tokens: int = 0
    checked: bool = False  # compared with what it should be (crossed tells how that went)
    crossed: bool = False
    detail: str = ""


@dataclass
class Reference:
    """A replay's answer when it ran alone."""
    text: str
    prompt: str


@dataclass
class Run:
    """What the users saw, gathered from every thread."""
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def watch(job, cancel: tuple[bool, float] | None) -> tuple[bool, float | None, bool]:
    """Wait for the job to end. cancel=(after_first_text, seconds): cancel it that long after the
    submit, or after its first streamed text. Returns whether it ended in time, the seconds to its
    first streamed output, and whether a cancel was sent."""
    start = time.monotonic()
    first, cancel_sent = None, False
    while not job.done():
        now = time.monotonic() - start
        if first is None and job.outputs():
            first = now
        anchor = None if cancel is None else (first if cancel[0] else 0.0)
        if anchor is not None and not cancel_sent and now >= anchor + cancel[1]:
            job.cancel()
            cancel_sent = True
        if now > ANSWER_TIMEOUT_S:
            job.cancel()
            return False, first, cancel_sent
        time.sleep(POLL_S)
    if first is None and job.outputs():
        first = time.monotonic() - start
    return True, first, cancel_sent


def error_kind(error: Exception) -> str:
    message = str(error)
    return "queue full" if "queue is full" in message.lower() else f"{type(error).__name__}: {message[:120]}"


def valid_request(rng: random.Random, references: dict[int, Reference]) -> tuple[str, dict, int | None, str | None]:
    """(endpoint, request, replay index or None, marker or None): a replay or a fresh request."""
    if references and rng.random() < MIX["replay"] / (MIX["replay"] + MIX["fresh"]):
        index = rng.choice(list(references))
        api_name, request = REPLAYS[index]
        return api_name, request, index, None
    api_name = rng.choice(list(TEXT_FIELD))
    marker = "".join(rng.choices(string.ascii_uppercase, k=8))
    request = {TEXT_FIELD[api_name]: FRESH_TEXT[api_name].format(marker=marker),
               "temperature": round(rng.uniform(0.1, 1.5), 2), "top_k": rng.choice([0, 5, 40, 200]),
               "top_p": round(rng.uniform(0.5, 1.0), 2), "repetition_penalty": round(rng.uniform(1.0, 1.3), 2),
               "no_repeat_ngram_size": rng.choice([0, 0, 2, 3]), "max_new_tokens": rng.randint(8, 64),
               "seed": rng.choice([None, rng.randint(0, 2**32 - 1)])}
    if api_name == "/translate":
        request["target"] = rng.choice(["French", "German"])
    return api_name, request, None, marker


def check_answer(outcome: Outcome, answer: tuple, request: dict, replay: int | None, marker: str | None,
                 references: dict[int, Reference]) -> None:
    """Whether the answer belongs to this request: a replay's text, prompt and seed are those it
    had alone; a fresh request's prompt has its marker and its status its seed."""
    text, status, prompt, _ = answer
    found = STATUS.match(status)
    if found is None:
        outcome.kind, outcome.explained, outcome.detail = "no status line", False, status[:120]
        return
    outcome.tokens, outcome.checked = int(found.group(3)), True
    seed = request.get("seed")
    if replay is not None:
        reference = references[replay]
        same = (text, prompt) == (reference.text, reference.prompt) and (seed is None or int(found.group(1)) == seed)
        if not same:
            outcome.crossed = True
            other = next((i for i, r in references.items() if r.text == text), None)  # another replay's text?
            outcome.detail = f"replay gave {text[:60]!r}" + (f" (replay {other}'s text)" if other is not None else "")
    elif marker not in prompt or (seed is not None and int(found.group(1)) != seed):
        outcome.crossed, outcome.detail = True, f"fresh request {marker} got prompt {prompt[:60]!r}, {status[:30]}"


def refusal(client: Client, api_name: str, request: dict, expected: str) -> Outcome:
    """An invalid request, which must be refused with the message that says why."""
    job = client.submit(**request, api_name=api_name)
    if not watch(job, None)[0]:
        return Outcome(api_name, f"no answer within {ANSWER_TIMEOUT_S} s", explained=False)
    try:
        job.result()
    except Exception as error:
        if expected in str(error):
            return Outcome(api_name, f"refused: {expected}")
        kind = error_kind(error)
        return Outcome(api_name, kind, explained=kind == "queue full")
    return Outcome(api_name, f"answered although invalid ({expected})", explained=False)


def answer(client: Client, rng: random.Random, references: dict[int, Reference],
           cancel: tuple[bool, float] | None) -> Outcome:
    """A valid request, cancelled as `watch` says; checked when it completes."""
    api_name, request, replay, marker = valid_request(rng, references)
    job = client.submit(**request, api_name=api_name)
    ended, ttft_s, cancel_sent = watch(job, cancel)
    if not ended:
        return Outcome(api_name, f"no answer within {ANSWER_TIMEOUT_S} s", explained=False)
    outputs = job.outputs()
    if cancel_sent and not (outputs and outputs[-1][1]):  # a run's last output, and only that, has its status line
        return Outcome(api_name, CANCELLED_STREAMING if outputs else CANCELLED_WAITING, ttft_s=ttft_s)
    try:
        result = outputs[-1] if cancel_sent else job.result()  # a cancelled job's result() raises
    except Exception as error:
        kind = error_kind(error)
        return Outcome(api_name, kind, explained=kind == "queue full")
    outcome = Outcome(api_name, "completed", ttft_s=ttft_s)
    check_answer(outcome, tuple(result), request, replay, marker, references)
    return outcome


def user(client: Client | None, name: str, deadline: float, references: dict[int, Reference], v1: V1 | None,
         run: Run) -> None:
    """One user: requests one after another until the deadline, its choices seeded by its name."""
    rng = random.Random(name)
    with httpx.Client() as http:
        while time.monotonic() < deadline:
            # (a deployment of replicas, with no Gradio: every request through /v1)
            roll, through_v1 = rng.random(), v1 is not None and (rng.random() < V1_SHARE or client is None)
            try:
                if roll < MIX["invalid"]:
                    if through_v1:
                        run.add(v1_refusal(http, rng, v1))
                        continue
                    api_name, request, expected = rng.choice(INVALID)
                    run.add(refusal(client, api_name, request, expected))
                else:
                    cancels = roll < MIX["invalid"] + MIX["cancel"]
                    cancel = (rng.random() < 0.5, rng.uniform(0, CANCEL_WITHIN_S)) if cancels else None
                    run.add(v1_answer(http, rng, v1, cancel) if through_v1 else answer(client, rng, references, cancel))
            except Exception as error:  # the client itself failed: connection refused, reset, ...
                run.add(Outcome("?", error_kind(error), explained=False))


def drive(clients: list[Client | None], seed: str, seconds: float, references: dict[int, Reference],
          v1: V1 | None) -> tuple[list[Outcome], float]:
    """Every user at once until `seconds` have passed (each finishes the request it is on);
    what they saw, and how long it took."""
    run, start = Run(), time.monotonic()
    threads = [threading.Thread(target=user, args=(client, f"{seed}-{i}", start + seconds, references, v1, run))
               for i, client in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return run.outcomes, time.monotonic() - start


def take_references(client: Client) -> dict[int, Reference]:
    """Each replay's answer, alone; a replay this app cannot answer (a model without that adapter)
    is left out of the run."""
    references = {}
    for index, (api_name, request) in enumerate(REPLAYS):
        try:
            text, status, prompt, _ = client.predict(**request, api_name=api_name)
        except Exception as error:
            print(f"replay {index} ({api_name}) left out: {error}", flush=True)
            continue
        references[index] = Reference(text, prompt)
    return references


# --- OpenAI's /v1 API ----------------------------------------------------------------------------

V1_SHARE = 0.3  # of each user's requests, those sent through /v1
V1_GRACE_S = 10  # how long a 404 from /v1/models may still mean "not mounted yet"
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
V1_BASE = {COMPLETIONS: dict(prompt="Hello", max_tokens=8),
           CHAT: dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=8)}
# (route, what spoils a good request, the status and the `param` its refusal must have)
V1_INVALID = [
    (COMPLETIONS, dict(temperature=99), 400, "temperature"),
    (COMPLETIONS, dict(max_tokens=10**30), 400, "max_tokens"),
    (COMPLETIONS, dict(logprobs=21), 400, "logprobs"),
    (COMPLETIONS, dict(n=9), 400, "n"),
    (COMPLETIONS, dict(prompt=42), 400, "prompt"),
    (COMPLETIONS, dict(prompt="x" * (MAX_CHARS["prompt"] + 1)), 400, "prompt"),
    (COMPLETIONS, dict(stop=5), 400, "stop"),
    (COMPLETIONS, dict(seed=-5), 400, "seed"),
    (COMPLETIONS, dict(top_k="many"), 400, "top_k"),
    (COMPLETIONS, dict(model="no-such-model"), 404, "model"),
    (CHAT, dict(messages=[]), 400, "messages"),
    (CHAT, dict(messages=[{"role": "user", "content": "x" * (MAX_CHARS["message"] + 1)}]), 400, "messages"),
    (CHAT, dict(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
]


@dataclass
class V1:
    """The app's /v1 API as the users drive it: its address, the model it serves (its ids), and the
    seeded or greedy requests replayed under load with their answers alone."""
    base: str
    model_ids: list[str]
    decode_path: str  # as the app says it in X-Decode-Path
    replays: list[tuple[str, dict, str]] = field(default_factory=list)  # route, request, its text alone

    @property
    def model(self) -> str:
        return self.model_ids[0]

    def replay_requests(self) -> list[tuple[str, dict]]:
        """The replays this model can answer (an adapter's id where it has that adapter)."""
        chat = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hello, how are you?"},
                {"role": "user", "content": "And then what happened?"}]
        replays = [
            (COMPLETIONS, dict(model=self.model, prompt="Once upon a time, there was a little fox who",
                               max_tokens=48, seed=11)),
            (COMPLETIONS, dict(model=self.model, prompt="The old king called his three sons and said,",
                               temperature=0, max_tokens=40, logprobs=3)),
            (CHAT, dict(model=f"{self.model}:dialogue", messages=chat, seed=14, max_tokens=48, top_k=40)),
            (COMPLETIONS, dict(model=f"{self.model}:translate", prompt="The cat is sleeping on the chair.",
                               temperature=0, max_tokens=24)),
        ]
        return [(route, request) for route, request in replays if request["model"] in self.model_ids]


@dataclass
class V1Answer:
    status: int
    text: str = ""
    fingerprint: str = ""
    tokens: int = 0
    error: dict | None = None  # OpenAI's error object, where one came
    ttft_s: float | None = None
    cancelled: str | None = None  # CANCELLED_WAITING or CANCELLED_STREAMING where the client closed it


def v1_text(choice: dict) -> str:
    return choice.get("text") or (choice.get("message") or choice.get("delta") or {}).get("content") or ""


def v1_send(http: httpx.Client, v1: V1, route: str, request: dict,
            cancel: tuple[bool, float] | None = None) -> V1Answer:
    """POST a /v1 request (streamed where it says so) and gather its first choice. cancel, for a
    stream: (after_first_text, seconds), as `watch` takes it; the client closes the connection."""
    url, start = v1.base + route, time.monotonic()
    if not request.get("stream"):
        response = http.post(url, json=request, timeout=ANSWER_TIMEOUT_S)
        body = response.json()
        if response.status_code != 200:
            return V1Answer(response.status_code, error=body.get("error"))
        return V1Answer(200, v1_text(body["choices"][0]), body.get("system_fingerprint", ""),
                        body["usage"]["completion_tokens"])
    request = {**request, "stream_options": {"include_usage": True}}
    after_first, delay = cancel or (False, ANSWER_TIMEOUT_S)
    # Before the first text, nothing may arrive for `delay`: the read times out and the connection closes.
    timeout = httpx.Timeout(ANSWER_TIMEOUT_S, read=ANSWER_TIMEOUT_S if after_first else delay)
    answer = V1Answer(200)
    try:
        with http.stream("POST", url, json=request, timeout=timeout) as response:
            if response.status_code != 200:
                response.read()
                return V1Answer(response.status_code, error=response.json().get("error"))
            for line in response.iter_lines():
                data = line.removeprefix("data: ")
                if data == line or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    return replace(answer, status=500, error=chunk["error"])
                answer.fingerprint = chunk.get("system_fingerprint", answer.fingerprint)
                if chunk.get("usage"):
                    answer.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    answer.text += v1_text(choice)
                now = time.monotonic() - start
                if answer.ttft_s is None and answer.text:
                    answer.ttft_s = now
                anchor = answer.ttft_s if after_first else 0.0
                if cancel and anchor is not None and now >= anchor + delay:
                    answer.cancelled = CANCELLED_STREAMING if answer.text else CANCELLED_WAITING
                    return answer  # leaving the block closes the connection mid-stream
    except httpx.ReadTimeout:
        if cancel is None:
            raise
        answer.cancelled = CANCELLED_STREAMING if answer.text else CANCELLED_WAITING
    return answer


def v1_refusal(http: httpx.Client, rng: random.Random, v1: V1) -> Outcome:
    """An invalid /v1 request (streamed or not): it must get its status, naming the field."""
    route, spoiled, status, param = rng.choice(V1_INVALID)
    request = {"model": v1.model, **V1_BASE[route], **spoiled, "stream": rng.random() < 0.5}
    answer = v1_send(http, v1, route, request)
    error = answer.error or {}
    if answer.status == status and error.get("param") == param and error.get("message"):
        return Outcome(route, f"refused: {status} {param}")
    if answer.status == 429:
        return Outcome(route, "queue full")
    return Outcome(route, f"{answer.status} for a bad {param}", explained=False, detail=str(error)[:120])


def v1_answer(http: httpx.Client, rng: random.Random, v1: V1, cancel: tuple[bool, float] | None) -> Outcome:
    """A valid /v1 request: a replay (checked against its text alone) or a fresh one (its prompt
    echoed, its seed reported), streamed or not; a cancelled one is always streamed."""
    marker = None
    if v1.replays and rng.random() < MIX["replay"] / (MIX["replay"] + MIX["fresh"]):
        route, request, expected = rng.choice(v1.replays)
    else:
        route, expected = rng.choice([COMPLETIONS, CHAT]), None
        marker = "".join(rng.choices(string.ascii_uppercase, k=8))
        request = {"model": v1.model, "temperature": round(rng.uniform(0.1, 1.5), 2),
                   "top_k": rng.choice([0, 5, 40, 200]), "top_p": round(rng.uniform(0.5, 1.0), 2),
                   "repetition_penalty": round(rng.uniform(1.0, 1.3), 2), "max_tokens": rng.randint(8, 64),
                   "seed": rng.choice([None, rng.randint(0, 2**32 - 1)])}
        if route == COMPLETIONS:
            request.update(prompt=FRESH_TEXT["/generate"].format(marker=marker), echo=True)
        else:
            request["messages"] = [{"role": "user", "content": FRESH_TEXT["/chat"].format(marker=marker)}]
    request = {**request, "stream": cancel is not None or rng.random() < 0.5}
    answer = v1_send(http, v1, route, request, cancel)
    if answer.cancelled:
        return Outcome(route, answer.cancelled, ttft_s=answer.ttft_s)
    if answer.status != 200:
        kind = "queue full" if answer.status == 429 else f"{answer.status}: {(answer.error or {}).get('message')}"
        return Outcome(route, kind, explained=answer.status == 429)
    outcome = Outcome(route, "completed", ttft_s=answer.ttft_s, tokens=answer.tokens, checked=True)
    seed = request.get("seed")
    if seed is not None and answer.fingerprint != f"seed-{seed}":
        outcome.crossed, outcome.detail = True, f"seed {seed} came back as {answer.fingerprint!r}"
    elif expected is not None and answer.text != expected:
        outcome.crossed, outcome.detail = True, f"replay gave {answer.text[:60]!r}, alone {expected[:60]!r}"
    elif route == COMPLETIONS and expected is None and not answer.text.startswith(request["prompt"]):
        outcome.crossed, outcome.detail = True, f"fresh request {marker} got {answer.text[:60]!r}"
    return outcome


def v1_api(url: str, timeout_s: float = 600) -> V1 | None:
    """The app's /v1 API once its decode path has settled (the kernels built, or known not to be),
    so that the replays' solo answers are taken on the path they are checked against; None where
    the app has no /v1 (one in front of a backend), after V1_GRACE_S of 404s: the /v1 routes join
    Gradio's server just after it starts answering (app.launch), so a first 404 may only be early."""
    base, deadline = url.rstrip("/"), time.monotonic() + timeout_s
    grace = time.monotonic() + V1_GRACE_S
    while True:
        response = httpx.get(base + "/v1/models", timeout=30)
        if response.status_code == 404:
            if time.monotonic() > grace:
                return None
            time.sleep(0.5)
            continue
        path = response.headers.get("x-decode-path", "")
        if path != BUILDING or time.monotonic() > deadline:
            return V1(base, [model["id"] for model in response.json()["data"]], path)
        time.sleep(1)


def serves_gradio(url: str) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/config", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def take_v1_references(v1: V1) -> None:
    """Each /v1 replay's answer alone, not streamed."""
    with httpx.Client() as http:
        for route, request in v1.replay_requests():
            answer = v1_send(http, v1, route, request)
            if answer.status != 200:
                print(f"/v1 replay {request} left out: {answer.error}", flush=True)
                continue
            v1.replays.append((route, request, answer.text))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(model: str, device: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free loopback port; returns it and its URL once it answers."""
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "app.py", "--model", model, "--device", device,
                                    "--host", "127.0.0.1", "--port", str(port)],
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    wait_for_app(process, url, log_path)
    return process, url


def wait_for_app(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float = 300) -> None:
    """Return once the app started as `process` serves its page at `url`. SystemExit with its log
    when it stops first, or when it has not answered within timeout_s (it is stopped then)."""
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever the environment says
    deadline = time.monotonic() + timeout_s
    while True:
        try:  # a plain GET: a gradio_client Client per try would fetch the whole API each time
            no_proxy.open(url, timeout=10).close()
            return
        except OSError:  # refused while it starts; an HTTPError (an OSError too) is not serving either
            if process.poll() is not None:
                raise SystemExit(f"the app stopped while starting:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                process.terminate()
                raise SystemExit(f"the app did not answer within {timeout_s:g} s:\n{log_path.read_text()}")
            time.sleep(0.5)


def server_pid(url: str) -> int | None:
    """The pid listening on the URL's port, when this user may see it."""
    port = urlparse(url).port
    try:
        return next((c.pid for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port), None)
    except psutil.AccessDenied:
        return None


def rss_mb(pid: int | None) -> float | None:
    return None if pid is None else psutil.Process(pid).memory_info().rss / 2**20


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    return values[0] if len(values) == 1 else statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def counts(outcomes: list[Outcome]) -> dict:
    """How many requests, how many failed unexplained, how many were checked and came back crossed."""
    return {"requests": len(outcomes), "unexplained": sum(not o.explained for o in outcomes),
            "checked": sum(o.checked for o in outcomes), "crossed": sum(o.crossed for o in outcomes)}


def summarize(outcomes: list[Outcome], elapsed_s: float) -> dict:
    """The run's numbers, overall and by endpoint."""
    def numbers(group: list[Outcome]) -> dict:
        completed = [o for o in group if o.kind == "completed"]
        ttft = [o.ttft_s * 1000 for o in completed if o.ttft_s is not None]
        return {**counts(group), "completed": len(completed),
                "refused": sum(o.kind.startswith("refused: ") for o in group),
                "cancelled": sum(o.kind in (CANCELLED_WAITING, CANCELLED_STREAMING) for o in group),
                "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
                "tokens": sum(o.tokens for o in completed)}
    by_endpoint = defaultdict(list)
    for outcome in outcomes:
        by_endpoint[outcome.api_name].append(outcome)
    report = numbers(outcomes)
    report["tokens_per_s"] = report["tokens"] / elapsed_s
    report["errors"] = dict(Counter(o.kind for o in outcomes if o.kind != "completed").most_common())
    report["unexplained_examples"] = [f"{o.api_name}: {o.kind} {o.detail}" for o in outcomes if not o.explained][:10]
    report["crossed_examples"] = [f"{o.api_name}: {o.detail}" for o in outcomes if o.crossed][:10]
    report["by_endpoint"] = {name: numbers(group) for name, group in sorted(by_endpoint.items())}
    report["by_path"] = {path: numbers([o for o in outcomes if path_of(o.api_name) == path]) for path in PATHS}
    report["page_over_v1_p50"] = path_ratio(report["by_path"])
    return report


PATHS = ("page", "/v1")  # Gradio's endpoints, as the page runs them, and OpenAI's API: one queue should serve both


def path_of(api_name: str) -> str | None:
    """Which way a request went in (PATHS); None for a user whose client itself failed ("?")."""
    if api_name.startswith("/v1"):
        return "/v1"
    return "page" if api_name in APIS else None


def path_ratio(by_path: dict) -> float | None:
    """How much longer a page request waited for its first text than a /v1 one (p50 over p50)."""
    page, v1 = (by_path[path]["ttft_p50_ms"] for path in PATHS)
    return None if page is None or not v1 else page / v1


def server_log_faults(log_path: Path | None) -> dict | None:
    """What the app logged: failed generations and tracebacks (there should be none), and runs
    ended by a cancel or a client leaving."""
    if log_path is None:
        return None
    log = log_path.read_text(errors="replace")
    return {"generation_failed": log.count("generation failed"), "tracebacks": log.count("Traceback"),
            "cancelled_runs": log.count("cancelled, or its client left")}


def table(report: dict) -> str:
    def whole(value):  # milliseconds and megabytes alike
        return "-" if value is None else f"{value:.0f}"

    faults = report["server_log"]
    rows = [
        ("requests done", report["requests"]),
        ("completed (and checked)", report["completed"]),
        ("refused as invalid, with the message that says why", report["refused"]),
        ("cancelled by their user", report["cancelled"]),
        ("unexplained failures", report["unexplained"]),
        ("outputs crossed between users", f"{report['crossed']} of {report['checked']} checked"),
        ("latency to first text, p50 / p95 (ms)", f"{whole(report['ttft_p50_ms'])} / {whole(report['ttft_p95_ms'])}"),
        ("tokens/s, all users", f"{report['tokens_per_s']:.1f}"),
        ("app resident memory, after warm-up / at the end (MB)",
         f"{whole(report['rss_start_mb'])} / {whole(report['rss_end_mb'])}"
         + ("" if report["rss_change_pct"] is None else f" ({report['rss_change_pct']:+.1f}%)")),
        ("app log, warm-up included: generation failures / tracebacks / runs ended by a cancel",
         "-" if faults is None else f"{faults['generation_failed']} / {faults['tracebacks']} / "
                                    f"{faults['cancelled_runs']}"),
        ("warm-up: requests / unexplained / crossed",
         " / ".join(str(report["warm_up"][key]) for key in ("requests", "unexplained", "crossed"))),
    ]
    lines = [f"{report['clients']} clients for {report['seconds']} s against {report['url']} "
             f"({report['model']}, decoding on {report['decode_path'] or 'an unknown path'}); "
             f"{report['replays']} replays checked against their solo answers", "",
             "| | |", "|---|---:|", *(f"| {label} | {value} |" for label, value in rows), "",
             "| errors by kind | count |", "|---|---:|",
             *(f"| {kind} | {count} |" for kind, count in report["errors"].items()), "",
             "| endpoint | requests | completed | refused | cancelled | unexplained | crossed | "
             "first text p50 / p95 (ms) |", "|---|---:|---:|---:|---:|---:|---:|---:|",
             *(f"| {name} | {n['requests']} | {n['completed']} | {n['refused']} | {n['cancelled']} | "
               f"{n['unexplained']} | {n['crossed']} | {whole(n['ttft_p50_ms'])} / {whole(n['ttft_p95_ms'])} |"
               for name, n in report["by_endpoint"].items()), "",
             "| way in | requests | completed | first text p50 / p95 (ms) |", "|---|---:|---:|---:|",
             *(f"| {path} | {n['requests']} | {n['completed']} | {whole(n['ttft_p50_ms'])} / {whole(n['ttft_p95_ms'])} |"
               for path, n in report["by_path"].items()),
             "", f"page p50 / /v1 p50 of the first text: {ratio_text(report['page_over_v1_p50'])}"]
    for title in ("unexplained_examples", "crossed_examples"):
        if report[title]:
            lines += ["", title.replace("_", " ") + ":", *(f"- {line}" for line in report[title])]
    return "\n".join(lines)


def ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8, help="concurrent users (default 8)")
    p.add_argument("--seconds", type=float, default=30, help="how long they keep sending requests (default 30)")
    p.add_argument("--warm-up", type=float, default=30,
                   help="seconds of the same load before the app's memory at start is read (default 30)")
    p.add_argument("--url", help="an app already running on loopback, or a deployment of replicas (serve/cluster.py: "
                                 "/v1 alone); default: start one here")
    p.add_argument("--pid", type=int, help="with --url: the app's pid, for its memory (default: found by its port)")
    p.add_argument("--model", default="bundled", help="without --url: the model to start the app with")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="without --url: where it runs")
    p.add_argument("--seed", type=int, default=0, help="seeds each user's choices")
    p.add_argument("--json", type=Path, help="also write the report to this JSON file")
    args = p.parse_args(argv)
    if args.url and urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        p.error("--url must be on loopback: this sends hostile requests")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    process, log_path = None, None
    if args.url:
        url, pid = args.url.rstrip("/") + "/", args.pid or server_pid(args.url)
    else:
        log_path = Path(tempfile.mkdtemp(prefix="bench-load-")) / "app.log"
        print(f"starting the app on {args.model} (log: {log_path})", flush=True)
        process, url = start_app(args.model, args.device, log_path)
        pid = process.pid
    try:
        v1 = v1_api(url)  # first: it waits for the decode path to settle
        if serves_gradio(url):
            clients = [Client(url, verbose=False) for _ in range(args.clients)]
            references = take_references(clients[0])
        elif v1 is not None:  # a deployment of replicas (serve/cluster.py): /v1 alone
            clients, references = [None] * args.clients, {}
        else:
            raise SystemExit(f"{url} serves neither the app's Gradio API nor /v1")
        if v1 is not None:
            take_v1_references(v1)
        replays = len(references) + (len(v1.replays) if v1 else 0)
        print(f"{replays} replays answered alone; {args.clients} users: {args.warm_up:g} s of warm-up, "
              f"then {args.seconds:g} s ...", flush=True)
        warm_up, _ = drive(clients, f"{args.seed}-warm-up", args.warm_up, references, v1)
        rss_start = rss_mb(pid)
        outcomes, elapsed = drive(clients, str(args.seed), args.seconds, references, v1)
        rss_end = rss_mb(pid)
    finally:
        if process is not None:
            process.terminate()
            process.wait(60)
    report = {"clients": args.clients, "seconds": args.seconds, "url": url,
              "model": args.model if process else "running app", "replays": replays,
              "decode_path": v1.decode_path if v1 else None,
              **summarize(outcomes, elapsed), "rss_start_mb": rss_start, "rss_end_mb": rss_end,
              "rss_change_pct": None if rss_start is None else 100 * (rss_end / rss_start - 1),
              "warm_up": counts(warm_up),
              "server_log": server_log_faults(log_path)}
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Hardening (issue 7): what strangers send cannot crash the app, hold it, read the host's files
or cross two users' outputs. Fuzzed API calls, each limit's message, file access, faults (a model
that fails to load, a generation that raises, a cancel or a client that leaves mid-stream), the
chat exports' cap, and a short run of `python -m bench.load`.

HARDENING_FUZZ_EXAMPLES=125 runs 500 fuzzed calls (125 per endpoint) instead of CI's 100.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import httpx
import openai
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, event, given, settings, strategies as st

import app
from bench.load import APIS, OUT_OF_RANGE, REPLAYS, TOO_LONG
from model.checkpoint import BUNDLED_DIR
from engine.generate import MAX_SEED, SamplingParams, generate
from engine.scheduler import Scheduler
from model.tokenizer import load_tokenizer
from tasks import LANGUAGES
from ui.conversation import Conversation
from ui.tabs import chat
from serve.admission import QUEUE_FULL
from serve.messages import Message, english
from serve.model_host import ModelHost
from serve.running import MAX_CHARS, MAX_NEW_TOKENS

from .conftest import REPO, refused, serve_studio, wait_until, write_small_bpe

pytestmark = pytest.mark.slow  # the app served, under bad and heavy requests

GENERIC_ERROR = "has not enabled verbose error reporting"  # Gradio's answer to an exception it was not told about
FUZZ_EXAMPLES = int(os.environ.get("HARDENING_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def host(app_models) -> ModelHost:
    return ModelHost(app_models, device="cpu")  # with adapters; plain; one that fails to load


@pytest.fixture(scope="module")
def url(host):
    with serve_studio(host) as url:
        yield url


@pytest.fixture(scope="module")
def client(url) -> Client:
    return Client(url, verbose=False)


def answered(client: Client, api_name: str, **request) -> tuple[str, str, str]:
    """(text, status, prompt sent): the answer, less its logprobs (off here)."""
    return tuple(client.submit(**request, api_name=api_name).result(timeout=120))[:3]


def assert_serving(client: Client) -> None:
    _, status, _ = answered(client, "/generate", prompt="Hello", max_new_tokens=2, seed=1)
    assert status.startswith("seed 1 · ") and "2 generated tokens" in status


def error_of(client: Client, api_name: str, **request) -> str:
    with pytest.raises(AppError) as error:
        answered(client, api_name, **request)
    return str(error.value)


# --- limits -------------------------------------------------------------------------------------

# The cases, with the messages they must get, are bench.load's: the load run sends them too.
@pytest.mark.parametrize("api_name, request_, message", TOO_LONG, ids=[m for _, _, m in TOO_LONG])
def test_each_input_limit_names_the_field_and_the_limit(client, api_name, request_, message):
    assert message in error_of(client, api_name, **request_, max_new_tokens=2)


@pytest.mark.parametrize("api_name, request_, message", OUT_OF_RANGE, ids=[m for _, _, m in OUT_OF_RANGE])
def test_settings_out_of_range_are_refused_with_a_short_message(client, api_name, request_, message):
    error = error_of(client, api_name, **request_)
    assert message in error and len(error) < 200


def test_messages_name_a_field_as_its_tab_does_and_write_big_numbers_with_separators(client):
    error = error_of(client, "/translate", text="x" * 4_001, max_new_tokens=2)
    assert "text to translate is too long: 4,001 characters; the limit is 4,000" in error
    assert "seed must be between 0 and 4,294,967,295, got 4294967296" in error_of(
        client, "/generate", prompt="Hello", seed=2 ** 32)


def test_text_at_its_limit_is_taken(client):
    persona = ("Bot is kind and patient. " * 50)[:MAX_CHARS["persona"] - 1] + "."
    assert len(persona) == MAX_CHARS["persona"]
    _, _, prompt = answered(client, "/chat", message="Hi", persona=persona, max_new_tokens=2)
    assert prompt.startswith(persona + "\n")


def test_the_ui_offers_at_most_the_token_cap(url):
    components = httpx.get(f"{url}config").json()["components"]
    sliders = {c["props"].get("elem_id"): c["props"] for c in components}
    assert {sliders[f"{task}-max_new_tokens"]["maximum"] for task in app.TASKS} == {MAX_NEW_TOKENS}


ODD_TEXT = ["👩‍👩‍👧‍👦🏳️‍🌈 emoji", "مرحبا بالعالم، שלום", "\u202eright-to-left override", "nul\x00 bell\x07 \x1b[31mred",
            "\u200b\u200d\ufeff", "<|endoftext|> in the text", "a" * 19_000, "\ufffd\U0010ffff"]


@pytest.mark.parametrize("text", ODD_TEXT, ids=range(len(ODD_TEXT)))
def test_any_text_is_taken_as_it_is(client, app_models, text):
    _, status, prompt = answered(client, "/generate", prompt=text, max_new_tokens=2)
    assert "generated tokens" in status
    if "prompt cut to its last" in status:  # "a" * 19_000 is thousands of tokens: more than the context
        tokens = len(load_tokenizer(app_models[0]).encode(text))
        assert len(text) == 19_000 and f"of {tokens:,} tokens" in status and text.endswith(prompt)
    else:
        assert prompt == text


def test_the_bundled_tokenizer_reads_a_lone_surrogate_as_tiktoken_does(tmp_path):
    write_small_bpe(tmp_path)
    sentencepiece, bpe = load_tokenizer(BUNDLED_DIR), load_tokenizer(tmp_path)
    for tokenizer in (sentencepiece, bpe):
        assert tokenizer.decode(tokenizer.encode("a\ud800b")) == "a\ufffdb"


# --- fuzz ---------------------------------------------------------------------------------------

def odd_text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(exclude_categories=()), max_size=max_size)  # surrogates and all


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10**40, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, "\ud800 lone"]),
    odd_text(30),
    st.builds(lambda piece, n: piece * n, odd_text(3), st.integers(0, 70_000)),  # huge strings
    st.lists(odd_text(5), max_size=3), st.dictionaries(odd_text(3), st.integers(), max_size=2),
)
LINES = st.lists(st.tuples(odd_text(20), odd_text(20)), max_size=4).map(lambda pairs: "\n".join(f"{a} = {b}" for a, b in pairs))
VALID = {
    "prompt": odd_text(200), "article": odd_text(400), "message": odd_text(100), "persona": odd_text(60),
    "history": st.lists(st.lists(odd_text(40), min_size=2, max_size=2), max_size=4), "text": odd_text(100),
    "source": st.sampled_from(LANGUAGES), "target": st.sampled_from(LANGUAGES), "examples": st.none() | LINES,
    "temperature": st.floats(0, 5), "top_k": st.integers(0, 1000), "top_p": st.floats(0.01, 1),
    "min_p": st.floats(0, 1), "typical_p": st.floats(0.01, 1),
    "repetition_penalty": st.floats(0.5, 3), "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "no_repeat_ngram_size": st.integers(0, 10), "stop": odd_text(40) | st.lists(odd_text(10), max_size=4),
    "max_new_tokens": st.integers(1, 8), "seed": st.none() | st.integers(-1, MAX_SEED), "adapter": st.booleans(),
    "adapter_scale": st.floats(0, 2), "logprobs": st.integers(0, 20),
    # steering: lines that pair up or not, any layer the small models have, any strength the app takes
    "steer_positive": odd_text(60), "steer_negative": odd_text(60), "steer_layer": st.none() | st.integers(0, 2),
    "steer_strength": st.floats(-10, 10),
}


@st.composite
def payloads(draw, api_name: str) -> dict:
    """Up to two parameters hostile, the others valid or, where they have a default, left out: many
    calls are valid all through, and reach the model."""
    params = APIS[api_name].signature.parameters.values()
    hostile = draw(st.sets(st.sampled_from([p.name for p in params]), max_size=2))
    return {p.name: draw(HOSTILE if p.name in hostile else VALID[p.name]) for p in params
            if p.default is p.empty or p.name in hostile or draw(st.booleans())}


def strict_json(payload: dict) -> bool:
    """Whether gradio_client can send it: it refuses NaN, the infinities and lone surrogates."""
    try:
        json.dumps(payload, allow_nan=False, ensure_ascii=False).encode()
        return True
    except (ValueError, UnicodeEncodeError):
        return False


def call_rest(url: str, api_name: str, payload: dict) -> tuple[tuple | None, str | None]:
    """The endpoint through Gradio's REST route, with a body as loose as Python's json writes it:
    (outputs, None), or (None, the error message: None when Gradio gave none)."""
    bound = APIS[api_name].signature.bind(**payload)
    bound.apply_defaults()
    body = json.dumps({"data": list(bound.arguments.values())}, allow_nan=True)
    route = f"{url}gradio_api/call{api_name}"
    event = httpx.post(route, content=body, headers={"content-type": "application/json"}, timeout=60).json()
    with httpx.stream("GET", f"{route}/{event['event_id']}", timeout=120) as stream:
        lines = list(stream.iter_lines())
    kind = next(line for line in reversed(lines) if line.startswith("event: "))
    data = json.loads(lines[lines.index(kind) + 1].removeprefix("data: "))
    return (tuple(data)[:3], None) if kind == "event: complete" else (None, data and data["error"])


@pytest.mark.parametrize("api_name", APIS)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_calls_get_an_answer_or_a_clear_error_and_the_app_keeps_serving(client, url, api_name, data):
    payload = data.draw(payloads(api_name), label="payload")
    sendable = strict_json(payload)
    event("through gradio_client" if sendable else "through the REST route (NaN, inf, surrogates)")
    if sendable:
        try:
            outputs, error = answered(client, api_name, **payload), None
        except AppError as refused:
            outputs, error = None, str(refused)
    else:
        outputs, error = call_rest(url, api_name, payload)
    if error is None and outputs is not None:
        text, status, prompt = outputs
        assert isinstance(text, str) and isinstance(prompt, str) and re.match(r"seed \d+ · \d+ prompt \+ ", status)
        event("answered")
    else:
        event(f"refused: {error.split(' ')[0]}" if error else "refused without a message")
        assert error and GENERIC_ERROR not in error and not error.startswith("the generation failed"), error
        fields = [*APIS[api_name].signature.parameters, "prompt"]
        assert any(field in error for field in fields), f"the error names no field: {error}"
        assert len(error) < 500
    assert_serving(client)


# --- files and models: only what the app serves -------------------------------------------------

def test_the_host_files_stay_blocked_even_where_allowed_paths_open_them(app_models, tmp_path, monkeypatch):
    """Gradio's defaults alone serve none of these; what is tested is that the app's own blocking
    holds where `allowed_paths` opens their folders, as GRADIO_ALLOWED_PATHS can on a deployment."""
    (tmp_path / "shared.txt").write_text("for everyone")
    (tmp_path / "operator").mkdir()
    (tmp_path / "operator" / "secret.txt").write_text("blocked by the operator")
    monkeypatch.setenv("GRADIO_BLOCKED_PATHS", str(tmp_path / "operator"))  # kept beside the app's own
    # The Hugging Face cache, where hub models are downloaded to: a stand-in, as the app takes it.
    hf_cache = tmp_path / "hf-cache"
    cached = hf_cache / "models--gpt2" / "snapshots" / ("0" * 40) / "config.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("{}")
    monkeypatch.setattr(app, "HF_HUB_CACHE", str(hf_cache))
    opened = [str(tmp_path), str(REPO), str(Path(app_models[0]).parent)]
    with serve_studio(app_models[:1], allowed_paths=opened) as url:
        # Served: a folder opened and not blocked, so the refusals below are the blocking's.
        assert httpx.get(f"{url}gradio_api/file={tmp_path / 'shared.txt'}").text == "for everyone"
        private = [REPO / "app.py", "app.py", BUNDLED_DIR / "model.safetensors", Path(app_models[0]) / "config.json",
                   tmp_path / "operator" / "secret.txt", cached,
                   "/etc/passwd"]  # in no folder opened: Gradio's own refusal, checked all the same
        for path in private:
            assert httpx.get(f"{url}gradio_api/file={path}").status_code == 403, path


def join_queue(url: str, api_name: str, data: list) -> Iterator[dict]:
    """Run an event (a private one of the UI, too) as the browser does, through Gradio's queue;
    yield each message it sends back."""
    dependencies = httpx.get(f"{url}config").json()["dependencies"]
    fn_index = next(d["id"] for d in dependencies if d.get("api_name") == api_name)
    session = f"test-{time.monotonic_ns()}"
    httpx.post(f"{url}gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                                    "event_data": None, "trigger_id": None}).raise_for_status()
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                yield json.loads(line.removeprefix("data: "))


def ui_event(url: str, api_name: str, data: list) -> list[dict]:
    """Every message of one event, to its end."""
    messages = []
    for message in join_queue(url, api_name, data):
        messages.append(message)
        if message["msg"] == "process_completed":
            return messages
    raise AssertionError(f"the event did not complete: {messages}")


def api_data(client: Client, api_name: str, **values) -> list:
    """An endpoint's positional data: its parameters' defaults, with `values` by name."""
    parameters = client.view_api(return_format="dict", print_info=False)["named_endpoints"][api_name]["parameters"]
    return [values.get(p["parameter_name"], p["parameter_default"]) for p in parameters]


def test_the_model_panel_cannot_load_a_path_it_was_not_started_with(url, host, client):
    serving = host.current
    done = ui_event(url, "load_model", ["/etc"])[-1]
    assert not done["success"] and "/etc is not in the list of choices" in done["output"]["error"]
    with refused("not_a_model", name="'/etc'"):
        host.switch("/etc")  # and behind the dropdown, the host itself
    assert host.current is serving
    assert_serving(client)


def test_a_model_that_fails_to_load_leaves_the_previous_one_serving(url, host, client, app_models, caplog):
    serving = host.current
    messages = ui_event(url, "load_model", [app_models[2]])
    warnings = [m["log"] for m in messages if m["msg"] == "log"]
    assert messages[-1]["success"] and any(f"could not load {app_models[2]}" in w and "no weights file" in w
                                           for w in warnings)
    assert host.current is serving
    assert f"could not load model {app_models[2]}" in caplog.text
    assert_serving(client)


def test_weights_are_never_unpickled_freely_nor_remote_code_trusted():
    sources = [REPO / "app.py", *(path for folder in ("model", "tasks", "ui", "bench", "scripts")
                                  for path in (REPO / folder).rglob("*.py"))]
    for path in sources:
        code = path.read_text()
        assert "trust_remote_code" not in code and "import pickle" not in code, path
        for call in re.findall(r"torch\.load\([^)]*\)", code):
            assert "weights_only=True" in call, f"{path}: {call}"


# --- faults -------------------------------------------------------------------------------------

def test_a_cancel_mid_stream_frees_the_request_row(url, client, host, caplog):
    caplog.set_level(logging.INFO, logger="serve.model_host")
    scheduler = host.current.scheduler
    job = client.submit("Once upon a time", max_new_tokens=MAX_NEW_TOKENS, seed=1, api_name="/generate")
    for _ in job:
        break  # text is streaming: the request holds a row
    assert scheduler.rows_in_use == 1
    job.cancel()
    assert wait_until(lambda: scheduler.rows_in_use == 0), "the cancelled request still holds its row"
    assert wait_until(lambda: "/generate: cancelled, or its client left" in caplog.text)
    # Asked by a client of its own: gradio_client shares one event stream among a client's jobs,
    # and a request sent as the cancelled job's stream closes can be ended with it, client side
    # (its pending messages get the closing None), under load.
    assert_serving(Client(url, verbose=False))


def test_a_client_that_leaves_mid_stream_frees_its_row(url, host, client, caplog):
    caplog.set_level(logging.INFO, logger="serve.model_host")
    scheduler = host.current.scheduler
    data = api_data(client, "/generate", prompt="Once upon a time", max_new_tokens=MAX_NEW_TOKENS, seed=1)
    with closing(join_queue(url, "generate", data)) as messages:
        for message in messages:
            if message["msg"] == "process_generating":
                break  # and hang up
        else:
            pytest.fail("the request never started generating")
    assert wait_until(lambda: scheduler.rows_in_use == 0), "the request of a client that left still holds its row"
    # Freed because it was stopped, not because it ran out of tokens meanwhile.
    assert wait_until(lambda: "/generate: cancelled, or its client left" in caplog.text)
    assert_serving(client)


def test_a_generation_that_raises_is_a_clear_error_frees_its_row_and_is_logged(client, host, caplog):
    def out_of_memory(module, args):
        raise RuntimeError("out of memory (injected)")

    scheduler = host.current.scheduler
    hook = host.current.model.register_forward_pre_hook(out_of_memory)
    try:
        error = error_of(client, "/generate", prompt="Hello", max_new_tokens=4)
    finally:
        hook.remove()
    assert error.startswith("the generation failed (RuntimeError); the app is still serving")
    assert "/generate on " in caplog.text and "generation failed" in caplog.text and "out of memory (injected)" in caplog.text
    assert scheduler.rows_in_use == 0
    assert_serving(client)


def test_a_request_whose_sampling_fails_stops_alone_and_the_batch_goes_on(tiny_checkpoint):
    from model import load_pretrained
    model, tokenizer = load_pretrained(tiny_checkpoint)
    params = SamplingParams(temperature=0.8, max_new_tokens=24, seed=3)
    alone = generate(model, tokenizer, "The king said", params).token_ids
    broken = SamplingParams(max_new_tokens=24)
    object.__setattr__(broken, "temperature", 1e-300)  # past the check: the scores overflow to inf
    scheduler = Scheduler(model)
    good = scheduler.decode(tokenizer.encode("The king said"), params, 3)
    bad = scheduler.decode(tokenizer.encode("Hello"), broken, 1)
    first = next(good)  # both are admitted together
    with pytest.raises(RuntimeError, match="decoding failed .*probabilities to sample from are not finite"):
        list(bad)
    rest = list(good)
    assert [int(token) for token in [first, *rest]][:len(alone)] == alone
    assert wait_until(lambda: scheduler.rows_in_use == 0)


def test_chat_exports_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "EXPORT_DIR", tmp_path)
    monkeypatch.setattr(chat, "MAX_EXPORTS", 3)
    paths = []
    for n in range(5):
        paths.append(Path(chat.export_conversation(Conversation.from_pairs("", [[f"turn {n}", ""]]))))
        time.sleep(0.02)  # file times are coarse: one tick apart, their order is sure
    assert sorted(tmp_path.iterdir()) == sorted(path.parent for path in paths[-3:])
    assert json.loads(paths[-1].read_text()) == {
        "persona": "", "history": [["turn 4", ""]],
        "turns": [{"user": "turn 4", "replies": [{"text": "", "outcome": None}], "shown": 0}]}


# --- load ---------------------------------------------------------------------------------------

@contextmanager
def one_place(app_models, queue_size: int) -> Iterator[tuple[ModelHost, Client, openai.OpenAI, Callable[[], None]]]:
    """The app on a host that runs one request at a time, `queue_size` more waiting, with that one
    place taken by a /v1 stream that is not read on: (host, a Gradio client, a /v1 client, a
    function that closes the stream and so gives its place back)."""
    host = ModelHost(app_models[:1], device="cpu", concurrency=1, queue_size=queue_size)
    with serve_studio(host) as url:
        v1 = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="unused", max_retries=0)
        holding = v1.completions.create(model=host.current.name, prompt="Hold", stream=True, max_tokens=500, seed=1)
        next(iter(holding))  # decoding: the one place
        try:
            yield host, Client(url, verbose=False), v1, holding.close
        finally:
            holding.close()


def test_page_and_v1_requests_start_in_the_order_they_came(app_models):
    """The page's requests (Gradio's queue lets them through at once) and /v1's wait in one queue:
    with one place, a page request, then a /v1 one, then a page one start in that order. (When
    Gradio's workers held the page's, the /v1 request went ahead of the first page one.)"""
    started = []  # each run's prompt as it reaches the scheduler: one at a time, in the order they start
    with one_place(app_models, queue_size=3) as (host, client, v1, release), ThreadPoolExecutor(1) as pool:
        scheduler, decode = host.current.scheduler, host.current.scheduler.decode

        def recorded(prompt, *args, **kwargs):
            started.append(host.current.tokenizer.decode(prompt))
            return decode(prompt, *args, **kwargs)
        scheduler.decode = recorded
        first = client.submit("First", max_new_tokens=2, seed=1, api_name="/generate")
        assert wait_until(lambda: host.queue.waiting == 1, timeout_s=60)
        second = pool.submit(v1.completions.create, model=host.current.name, prompt="Second", max_tokens=2)
        assert wait_until(lambda: host.queue.waiting == 2, timeout_s=60)
        third = client.submit("Third", max_new_tokens=2, seed=1, api_name="/generate")
        assert wait_until(lambda: host.queue.waiting == 3, timeout_s=60)
        assert started == []  # all three wait for the one place
        release()
        first.result(timeout=120), second.result(timeout=120), third.result(timeout=120)
    assert [next(word for word in ("First", "Second", "Third") if word in prompt) for prompt in started] \
        == ["First", "Second", "Third"]


def test_a_full_queue_is_the_same_refusal_from_the_page_and_from_v1(app_models):
    with one_place(app_models, queue_size=1) as (host, client, v1, release):
        waiting = client.submit("Waiting", max_new_tokens=2, seed=1, api_name="/generate")
        assert wait_until(lambda: host.queue.waiting == 1, timeout_s=60)
        full = english(Message.keyed(QUEUE_FULL, capacity=2))
        with pytest.raises(AppError) as page:
            client.predict("Full", api_name="/generate")
        with pytest.raises(openai.RateLimitError) as api:
            v1.completions.create(model=host.current.name, prompt="Full", max_tokens=2)
        assert str(page.value) == full
        assert api.value.body["message"] == full and api.value.body["code"] == QUEUE_FULL
        assert api.value.response.headers["retry-after"]
        # and the page's own tabs, which run through the host: by the message's key
        *_, (_, outcome, _, _) = host.run(APIS["/generate"], {**api_defaults(), "prompt": "Full"})
        assert outcome.message == Message.keyed(QUEUE_FULL, capacity=2)
        release()
        assert waiting.result(timeout=120)[1].startswith("seed 1 · ")  # its turn came


def api_defaults(api_name: str = "/generate") -> dict:
    return {name: p.default for name, p in APIS[api_name].signature.parameters.items()}


def test_bench_load_runs_users_across_every_endpoint_and_finds_no_unexplained_failure(app_models, tmp_path):
    report_path = tmp_path / "load.json"
    run = subprocess.run([sys.executable, "-m", "bench.load", "--clients", "3", "--seconds", "10", "--warm-up", "3",
                          "--model", app_models[0], "--device", "cpu", "--json", str(report_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    assert set(report) >= {"clients", "seconds", "requests", "completed", "errors", "unexplained", "crossed",
                           "ttft_p50_ms", "ttft_p95_ms", "tokens_per_s", "rss_start_mb", "rss_end_mb"}
    assert report["requests"] > 0 and report["completed"] > 0
    assert report["unexplained"] == 0 and report["crossed"] == 0, report
    assert report["warm_up"]["unexplained"] == 0 and report["warm_up"]["crossed"] == 0
    assert report["server_log"]["generation_failed"] == 0 and report["server_log"]["tracebacks"] == 0
    assert set(report["by_endpoint"]) == set(APIS) | {"/v1/completions", "/v1/chat/completions"}
    assert set(report["by_path"]) == {"page", "/v1"} and "| way in |" in run.stdout  # side by side: one queue for both
    assert sum(n["requests"] for n in report["by_path"].values()) == report["requests"]
    assert report["replays"] == len(REPLAYS) + 4  # the /v1 replays too: the test model has every adapter
    assert report["rss_start_mb"] > 0 and math.isfinite(report["tokens_per_s"])
    assert "| requests done |" in run.stdout

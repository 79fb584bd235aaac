"""The app's API, through gradio_client against the app served on loopback (see conftest's
studio_url): every endpoint answers and streams, seeds reproduce, bad input is a clear error
after which the app keeps serving; and how the app is started."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from bench.load import MALFORMED, STATUS, free_port, wait_for_app
from ui.accessibility import SYMBOL_BUTTONS
from ui.i18n import CHINESE, ENGLISH
from ui.last_run import LastRun
from serve.model_host import ModelHost
from serve.running import MAX_UPDATES_PER_SECOND, Pacer
from ui.api import api_endpoint
from ui.tabs.generate import GENERATE

from .conftest import REPO, wait_until

pytestmark = pytest.mark.slow  # the app served, driven through gradio_client

# One request per endpoint; a few tokens keep them fast on a CPU.
REQUESTS = {
    "/generate": dict(prompt="Once upon a time"),
    "/chat": dict(message="How are you?", history=[["Hello", "Hi there!"]], persona="Bot is friendly."),
    "/translate": dict(text="The dog is happy."),
    "/summarize": dict(article="The sun rose over the hill. A little bird began to sing. The farmer went to work."),
}
FEW_TOKENS = dict(max_new_tokens=12, seed=7)


@pytest.fixture(scope="module")
def client(studio_url) -> Client:
    return Client(studio_url, verbose=False)


def test_the_api_names_its_endpoints_and_parameters(client):
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    # the Architecture tab's activation patching (tests/test_patching.py): its own four
    trace = endpoints.pop("/trace")
    assert [p["parameter_name"] for p in trace["parameters"]] == ["clean", "corrupted", "answer", "noise_span"]
    assert "p_clean" in trace["description"]
    # one comparison of two runs of any of the tasks (tests/test_compare_api.py)
    compare = endpoints.pop("/compare")
    assert [p["parameter_name"] for p in compare["parameters"]] == ["task", "compare", "values"]
    settings = ["temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "no_repeat_ngram_size", "max_new_tokens", "stop", "seed"]
    adapter = ["adapter", "adapter_scale"]  # only where the task has an adapter: Generate has none
    steering = ["steer_positive", "steer_negative", "steer_layer", "steer_strength"]
    own = {"/generate": ["prompt"], "/chat": ["message", "history", "persona", *adapter],
           "/translate": ["text", "source", "target", "examples", *adapter], "/summarize": ["article", *adapter]}
    assert {name: [p["parameter_name"] for p in endpoint["parameters"]] for name, endpoint in endpoints.items()} == {
        name: [*params[:len(params) - len(adapter) * (name != "/generate")], *settings,
               *(adapter if name != "/generate" else []), "logprobs", *steering] for name, params in own.items()}
    # Each endpoint's description says what it returns: four things, the logprobs last.
    for endpoint in endpoints.values():
        assert "Returns (text, status line, prompt sent, logprobs" in endpoint["description"]
    # Settings default to the task's own decoding defaults: the GPT-2 paper's top-k 2 for summaries.
    summarize = {p["parameter_name"]: p["parameter_default"] for p in endpoints["/summarize"]["parameters"]}
    assert summarize["top_k"] == 2 and summarize["max_new_tokens"] == 100 and summarize["seed"] is None
    assert summarize["stop"] == "" and summarize["presence_penalty"] == summarize["frequency_penalty"] == 0


@pytest.mark.parametrize("api_name", REQUESTS)
def test_every_endpoint_streams_text_and_reports_how_to_reproduce_it(client, api_name):
    job = client.submit(**REQUESTS[api_name], **FEW_TOKENS, api_name=api_name)
    updates = list(job)
    text, status, prompt, logprobs = job.result()
    assert text.strip()
    assert len(updates) > 1, "the text should arrive in pieces"
    assert status.startswith("seed 7 · ") and "generated tokens" in status and "stopped: " in status
    assert prompt  # the exact prompt, for the accordion
    assert updates[-1] == (text, status, prompt, logprobs)
    assert logprobs == []  # off unless asked for


def test_logprobs_come_as_a_fourth_output_when_asked_for(client):
    text, _, _, logprobs = client.predict("Once upon a time", temperature=0, max_new_tokens=8, logprobs=3,
                                          api_name="/generate")
    assert 0 < len(logprobs) <= 8 and "".join(entry["token"] for entry in logprobs).strip() == text.strip()
    for entry in logprobs:
        assert entry["logprob"] <= 0 and 1 <= len(entry["top"]) <= 3
        assert entry["top"][0]["token"] == entry["token"]  # greedy: the likeliest is the one chosen
        assert set(entry) == {"token", "bytes", "logprob", "top"}
        assert bytes(entry["bytes"]).decode(errors="replace") == entry["token"]
    error = client.submit("Hi", logprobs=21, api_name="/generate")
    with pytest.raises(AppError, match="logprobs must be between 0 and 20, got 21"):
        error.result()


def test_the_pacer_lets_the_first_update_go_at_once_and_then_one_per_interval():
    pacer = Pacer(per_second=4)
    assert [pacer.due(now) for now in (1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 3.0, 3.0)] == [
        True, False, True, False, True, False, True, False]


@pytest.fixture(scope="module")
def plain_host(app_models) -> ModelHost:
    return ModelHost(app_models[1:2], device="cpu")


def test_updates_come_at_most_so_often_and_each_holds_all_the_text_so_far(plain_host):
    # The tiny model makes hundreds of tokens a second: an update per token would be far more.
    endpoint = api_endpoint(GENERATE.api, plain_host)
    start = time.monotonic()
    updates = list(endpoint(prompt="Once upon a time", max_new_tokens=200, temperature=0.8, seed=3))
    elapsed = time.monotonic() - start
    text, status, _, _ = updates[-1]
    generated = int(STATUS.match(status).group(3))
    assert generated > 50 and len(updates) >= 2  # the first update at once, the last with the status
    assert len(updates) <= 2 + elapsed * MAX_UPDATES_PER_SECOND < generated
    assert all(text.startswith(earlier) for earlier, _, _, _ in updates)


def test_text_held_back_when_a_generation_fails_is_sent_before_the_error(plain_host):
    endpoint = api_endpoint(GENERATE.api, plain_host)
    request = dict(prompt="Once upon a time", temperature=0.8, seed=3)
    twenty_tokens = list(endpoint(**request, max_new_tokens=20))[-1][0]
    calls = 0

    def fail_after_twenty_tokens(module, args):  # the prompt's call, then one per token
        nonlocal calls
        calls += 1
        if calls > 20:
            raise RuntimeError("out of memory (injected)")

    hook = plain_host.current.model.register_forward_pre_hook(fail_after_twenty_tokens)
    updates = []
    try:
        with pytest.raises(gr.Error, match="the generation failed"):
            for update in endpoint(**request, max_new_tokens=200):
                updates.append(update)
    finally:
        hook.remove()
    # The tiny model makes 20 tokens in far less than 1 / MAX_UPDATES_PER_SECOND: without the
    # last update the user would see the first token's text and then the error.
    assert len(updates) >= 2 and updates[-1] == (twenty_tokens, "", "", [])


def test_bench_stream_measures_each_app_and_number_of_clients(studio_url, capsys):
    from bench import stream

    stream.main([studio_url, "--clients", "1", "2", "--tokens", "8", "--rounds", "1"])
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith(f"| {studio_url} |")]
    assert [clients for _, clients, _, _ in rows] == ["1", "2"]
    for _, _, tokens_per_s, updates in rows:
        assert float(tokens_per_s) > 0 and 2 <= float(updates) <= 9  # the first, the last, at most one a token


def test_the_same_seed_gives_the_same_text_and_another_seed_another(client):
    first, again, other = (client.predict("The little bird", max_new_tokens=16, seed=seed, api_name="/generate")
                           for seed in (42, 42, 43))
    assert first[0] == again[0] and first[1].startswith("seed 42 · ")
    assert other[0] != first[0]


def test_a_random_seed_is_reported_and_reproduces_the_run(client):
    text, status, _, _ = client.predict("The little bird", max_new_tokens=16, seed=-1, api_name="/generate")
    seed = int(status.split(" · ")[0].removeprefix("seed "))
    assert client.predict("The little bird", max_new_tokens=16, seed=seed, api_name="/generate")[0] == text


# Malformed input (the table the load run sends too), and refusals that depend on this app's
# model and adapters. Too long and out-of-range input: tests/test_hardening.py.
BAD_REQUESTS = [
    *MALFORMED,
    ("/translate", dict(text="a" + " a" * 999), "the text to translate: 1,001 tokens, but only 960 fit"),
    ("/chat", dict(message=""), "message is empty"),
]


def test_stop_strings_and_penalties_through_the_api_end_the_text_and_are_said_in_the_status_line(client):
    """`stop` as text (one a line, escapes read) or as a list ends the text before the first one
    written; the penalties change the text; the status line names all three; too many stop strings
    are refused."""
    greedy = dict(temperature=0, max_new_tokens=24, api_name="/generate")
    free, *_ = client.predict("Once upon a time", **greedy)
    word = free[len(free) // 2:][:3]  # from the middle of what it wrote
    assert len(word) == 3 and word.strip() == word and "\ufffd" not in word, free
    for stop in (f"nothing like it\n{word}", ["nothing like it", word]):
        text, status, *_ = client.predict("Once upon a time", stop=stop, **greedy)
        assert text == free[:free.index(word)] and "stopped: stop string" in status
        assert f'stop ["nothing like it", "{word}"]' in status
    penalised, status, *_ = client.predict("Once upon a time", presence_penalty=1.5, frequency_penalty=2, **greedy)
    assert penalised != free and "presence_penalty 1.5, frequency_penalty 2" in status
    with pytest.raises(AppError, match="stop must be at most 8 non-empty strings of at most 100 characters"):
        client.predict("Once upon a time", stop="\n".join("abcdefghi"), **greedy)


def test_a_page_in_front_of_replicas_passes_stop_strings_and_penalties_on(plain_host):
    """`app.py --backend`: the RemoteHost sends the values as they are to a replica's /studio/run,
    which runs them as the host here does: the same text and the same record of the settings."""
    from fastapi.testclient import TestClient

    from serve.admission import RunQueue
    from serve.apis import CHAT_API
    from serve.backend import RemoteHost
    from serve.replica import replica_app

    remote = object.__new__(RemoteHost)  # a RemoteHost whose HTTP client is the replica's app in-process
    remote.url, remote.http = "http://testserver", TestClient(replica_app(plain_host, "replica-1"))
    remote.queue = RunQueue()  # the page's own, which its runs take their turn in
    values = {**{name: p.default for name, p in CHAT_API.signature.parameters.items()}, "message": "Hello there!",
              "temperature": 0.9, "seed": 4, "presence_penalty": 1.0, "frequency_penalty": -0.5,
              "stop": "never\\n\\n"}
    *_, (text, outcome, _, _) = remote.run(CHAT_API, values)
    *_, (here, expected, _, _) = plain_host.run(CHAT_API, values)
    assert outcome.ran and (text, outcome.changed) == (here, expected.changed)
    assert dict(outcome.changed) == {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": -0.5,
                                     "stop": ("never\n\n",)}


def test_a_prompt_longer_than_the_context_is_read_from_its_newest_tokens(client):
    """As a notebook that goes on Continuing needs: the status line says what was cut."""
    prompt = "word" + " word" * 1099
    _, status, sent, _ = client.predict(prompt, max_new_tokens=4, api_name="/generate")
    assert "prompt cut to its last 1,020 of 1,100 tokens to fit the context" in status
    assert "max_new_tokens keeps" not in status  # 4 of 1,024 tokens kept for the output: no puzzle to explain
    assert "4 generated tokens" in status and prompt.endswith(sent) and len(sent) < len(prompt)


@pytest.mark.parametrize("api_name, request_, message", BAD_REQUESTS, ids=[m for _, _, m in BAD_REQUESTS])
def test_bad_input_is_a_clear_error_and_the_app_keeps_serving(client, api_name, request_, message):
    with pytest.raises(AppError) as error:
        client.predict(**request_, api_name=api_name)
    assert message in str(error.value)
    _, status, _, _ = client.predict("Hello", max_new_tokens=4, api_name="/generate")
    assert "4 generated tokens" in status


def test_chat_prompt_is_the_persona_and_history_then_the_message(client):
    _, _, prompt, _ = client.predict(**REQUESTS["/chat"], **FEW_TOKENS, api_name="/chat")
    assert prompt == "Bot is friendly.\nUser: Hello\nBot: Hi there!\nUser: How are you?\nBot:"


def test_translate_uses_the_example_pairs_given_or_the_built_in_ones(client):
    _, _, given, _ = client.predict("The dog is happy.", "English", "German", "cat = Katze\nhouse = Haus",
                                 **FEW_TOKENS, api_name="/translate")
    assert given == "English = Deutsch\ncat = Katze\nhouse = Haus\nThe dog is happy. ="  # own pairs: languages named
    _, _, built_in, _ = client.predict("The dog is happy.", "English", "German", **FEW_TOKENS, api_name="/translate")
    assert built_in.startswith("I would like a cup of coffee. = Ich hätte gern eine Tasse Kaffee.\n")


def test_an_adapter_changes_the_output_and_off_is_the_base_model(client):
    def summary(adapter):
        return client.predict(**REQUESTS["/summarize"], temperature=0, max_new_tokens=12, adapter=adapter,
                              api_name="/summarize")[0]
    assert summary(True) != summary(False)
    assert summary(False) == summary(False)


def test_the_status_line_says_how_the_adapter_was_set(client):
    def status(api_name, **adapter):
        return client.predict(**REQUESTS[api_name], max_new_tokens=4, seed=3, **adapter, api_name=api_name)[1]
    assert status("/summarize", adapter=False).split(" · ")[4] == "adapter off"
    assert status("/summarize", adapter=True).split(" · ")[4] == "adapter on"
    assert status("/summarize", adapter=True, adapter_scale=0.5).split(" · ")[4] == "adapter on at strength 0.5"
    assert "adapter" not in status("/generate")  # a task without one
    # the settings the seed alone does not give back: those changed from the task's defaults
    assert status("/summarize", adapter=False).split(" · ")[5] == "changed settings: max_new_tokens 4"
    assert (status("/summarize", adapter=False, temperature=0.5).split(" · ")[5]
            == "changed settings: temperature 0.5, max_new_tokens 4")


def test_two_users_at_once_each_get_their_own_output(studio_url):
    requests = [("Once upon a time", 1), ("The king said", 2), ("In the forest", 3), ("A small boat", 4)]
    alone = [Client(studio_url, verbose=False).predict(prompt, max_new_tokens=24, seed=seed, api_name="/generate")[0]
             for prompt, seed in requests]
    clients = [Client(studio_url, verbose=False) for _ in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda c, r: c.predict(r[0], max_new_tokens=24, seed=r[1], api_name="/generate")[0],
                                 clients, requests))
    assert together == alone


def test_a_cancelled_request_leaves_the_app_serving(client, caplog):
    caplog.set_level(logging.INFO, logger="serve.model_host")
    job = client.submit("Once upon a time", max_new_tokens=500, seed=1, api_name="/generate")
    for _ in job:
        break  # the first piece of text has arrived: the generation is running
    job.cancel()
    _, status, _, _ = client.predict("Hello", max_new_tokens=4, api_name="/generate")
    assert "4 generated tokens" in status
    assert wait_until(lambda: "/generate: cancelled, or its client left" in caplog.text)  # it was stopped


# --- start-up -----------------------------------------------------------------------------------

def test_the_start_up_lines_name_the_apps_own_flag_for_a_public_link(plain_host, capsys, monkeypatch):
    """Gradio's own line says "set `share=True` in `launch()`", which a user of app.py cannot do:
    the app says its --share instead, and where it serves."""
    monkeypatch.delenv("SPACE_ID", raising=False)
    demo = app.build_app(plain_host)
    port = free_port()
    try:
        app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True)
        said = capsys.readouterr().out
    finally:
        demo.close()
    assert f"Running on local URL:  http://127.0.0.1:{port}" in said
    assert "--share" in said and "share=True" not in said and "launch()" not in said, said


def test_flags_come_from_the_command_line_or_the_environment(monkeypatch):
    for name in ("STUDIO_MODEL", "STUDIO_DEVICE", "STUDIO_HOST", "STUDIO_PORT", "GRADIO_SERVER_PORT", "STUDIO_SHARE",
                 "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    defaults = app.parse_args([])
    assert (defaults.model, defaults.device, defaults.host, defaults.port, defaults.share) == (
        ["bundled"], "auto", "127.0.0.1", 7860, False)

    flags = app.parse_args(["--model", "gpt2,./ckpt", "--model", "distilgpt2", "--device", "cpu", "--port", "9000"])
    assert (flags.model, flags.device, flags.port) == (["gpt2", "./ckpt", "distilgpt2"], "cpu", 9000)

    monkeypatch.setenv("STUDIO_MODEL", "bundled, gpt2")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7861")
    monkeypatch.setenv("STUDIO_SHARE", "1")
    monkeypatch.setenv("SPACE_ID", "someone/studio")  # on a Space: listen on every interface
    from_env = app.parse_args([])
    assert (from_env.model, from_env.port, from_env.share, from_env.host) == (["bundled", "gpt2"], 7861, True, "0.0.0.0")


def test_loading_from_the_page_is_on_by_default_and_off_on_a_space(monkeypatch):
    """Off on a Space, where any visitor could fill the memory; either way a flag or the environment
    says otherwise."""
    for name in ("STUDIO_ALLOW_LOAD", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    assert app.parse_args([]).allow_load is True
    assert app.parse_args(["--no-allow-load"]).allow_load is False
    monkeypatch.setenv("STUDIO_ALLOW_LOAD", "0")
    assert app.parse_args([]).allow_load is False
    monkeypatch.delenv("STUDIO_ALLOW_LOAD")
    monkeypatch.setenv("SPACE_ID", "someone/studio")
    assert app.parse_args([]).allow_load is False
    assert app.parse_args(["--allow-load"]).allow_load is True
    monkeypatch.setenv("STUDIO_ALLOW_LOAD", "1")
    assert app.parse_args([]).allow_load is True


def test_python_app_py_serves_the_model_named_in_the_environment(app_models, tmp_path):
    port, log = free_port(), tmp_path / "app.log"
    env = {**os.environ, "STUDIO_MODEL": app_models[0], "STUDIO_DEVICE": "cpu"}
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=REPO, env=env,
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for_app(process, url, log, timeout_s=120)  # SystemExit, which fails the test, with the app's log
        _, status, _, _ = Client(url, verbose=False).predict("Hello", max_new_tokens=4, api_name="/generate")
        assert "4 generated tokens" in status
    finally:
        process.terminate()
        process.wait(30)


def test_a_model_that_cannot_load_stops_start_up_with_the_reason(app_models):
    with pytest.raises(SystemExit) as exit_:
        app.main(["--model", app_models[2], "--device", "cpu"])
    assert f"could not load {app_models[2]}" in exit_.value.code and "no weights file" in exit_.value.code


# --- interface text -----------------------------------------------------------------------------

def test_every_interface_text_is_in_english_and_chinese(app_models):
    assert ENGLISH.keys() == CHINESE.keys()
    assert all(CHINESE[key].strip() for key in CHINESE)
    # The built interface asks the browser to translate every key, and only those (str() of a key
    # is how Gradio writes it into text: __i18n__{"__type__": "translation_metadata", "key": ...}).
    # Built with loading from the page off and on (its controls, and the model list's help then).
    configs = [json.dumps(app.build_app(ModelHost(app_models[:1], device="cpu", allow_load=allow)).get_config_file(),
                          default=str) for allow in (False, True)]
    used = {key for config in configs for key in re.findall(r'translation_metadata\\", \\"key\\": \\"(\w+)', config)}
    # Shown only as things happen: "generating" while a run streams, "not_measured" where a lab plot
    # is missing, "example_pairs_kept" after a change of languages, "no_adapter_model" for a model
    # without a task's adapter (this one has them all), "example_pairs_unsent" with the translate
    # adapter on (this one starts it off), "example_pairs_through_english" for French <-> German;
    # "switch_model_info" in an app started with several models (this one has one). A symbol
    # button's name is the page script's (ui/accessibility.py).
    shown_later = {"generating", "not_measured", "example_pairs_kept", "no_adapter_model", "example_pairs_unsent",
                   "example_pairs_through_english", "switch_model_info", *SYMBOL_BUTTONS.values()}
    assert used | shown_later == ENGLISH.keys()


def test_the_model_list_says_how_to_get_more_than_the_one_model_it_started_with(app_models):
    def hint(models: list[str]) -> str:
        config = app.build_app(ModelHost(models, device="cpu")).get_config_file()
        info = next(c["props"]["info"] for c in config["components"] if c["props"].get("elem_id") == "model-choice")
        return re.search(r'"key": "(\w+)"', json.dumps(info, default=str).replace('\\"', '"')).group(1)
    assert hint(app_models[:1]) == "switch_model_info_one" and "--model" in ENGLISH["switch_model_info_one"]
    assert hint(app_models[:2]) == "switch_model_info"


def test_translate_greys_out_its_example_pairs_where_its_adapter_starts_on(app_models, tmp_path):
    """The pairs are not sent with the adapter on: where the model starts it on, the box starts
    greyed out (the test model starts it off: there the box is editable)."""
    from model.adapters import ON_BY_DEFAULT_FILE

    def examples_box(model: str) -> dict:
        config = app.build_app(ModelHost([model], device="cpu")).get_config_file()
        return next(c["props"] for c in config["components"] if c["props"].get("elem_id") == "translate-examples")
    assert examples_box(app_models[0])["interactive"] is True
    model = tmp_path / "translate-on"
    shutil.copytree(app_models[0], model)
    (model / "adapters" / ON_BY_DEFAULT_FILE).write_text('{"on": ["dialogue", "translate"]}')
    assert examples_box(str(model))["interactive"] is False


def ran(conversation, message, text, outcome, temperature=0.8, top_k=40):
    """The last run as the tab keeps it (LastRun): its outcome, the message it answered after the
    conversation's turns (a retry: the turns before the last), its settings and text."""
    history = [pair for pair in conversation.pairs if pair[0] != message]
    return LastRun(outcome, {"message": message, "history": history, "persona": conversation.persona,
                             "temperature": temperature, "top_k": top_k, "seed": outcome.seed}, text)


def test_the_reply_switcher_follows_the_last_turn():
    """After Retry, ◀ ▶ switch between the kept replies, each with its outcome; the record keeps a
    reply once, and a new turn's reply is the only one of its turn."""
    from engine.generate import Result
    from serve.messages import Refusal
    from serve.outcome import GREEDY_SAME, SAME_SEED, Outcome
    from serve.running import ADAPTER_ON
    from ui.conversation import Conversation
    from ui.tabs.chat import answered, messages_from_pairs

    def outcome(seed, speed, changed=()):
        return Outcome.done(Result("", seed, 5, 3, speed, "stop_string"), ADAPTER_ON, list(changed), [])

    first, shown = answered(Conversation("Bot is kind."), ran(Conversation(), "Hi", "Hello!", outcome(1, 80.0)))
    assert first.pairs == [["Hi", "Hello!"]] and shown == outcome(1, 80.0)
    second, shown = answered(first, ran(first, "Hi", "Good day.", outcome(2, 90.0)))
    last = second.turns[-1]
    assert (last.shown, len(last.replies), shown) == (1, 2, outcome(2, 90.0))
    assert second.pairs == [["Hi", "Good day."]]
    assert answered(second, ran(first, "Hi", "Good day.", outcome(2, 90.0))) is None  # kept once
    # The same reply from the same run (the speed aside) says why: a fixed seed, or greedy
    # decoding; a refusal, or a reply from other settings, does not.
    same = [answered(first, ran(first, "Hi", "Hello!", outcome(1, 70.0), *settings))[1].notes[-1]
            for settings in ((0.8, 40), (0, 40), (0.8, 1))]
    assert same == [SAME_SEED, GREEDY_SAME, GREEDY_SAME]
    other = outcome(1, 70.0, [("top_p", 0.9)])
    assert answered(first, ran(first, "Hi", "Hello!", other))[1] == other
    refused = Outcome.refused(Refusal("too_big", name="persona", size=1_001, limit=1_000))  # no new reply: none kept
    assert answered(first, ran(first, "Hi", "Hello!", outcome(1, 80.0)).with_outcome(refused)) is None
    # after ◀ to the first reply, a retry replaces that one: the same reply again is noted
    back = second.switched(-1)
    assert (back.pairs, back.turns[-1].reply.outcome) == ([["Hi", "Hello!"]], outcome(1, 80.0))
    third, noted = answered(back, ran(back, "Hi", "Hello!", outcome(1, 60.0)))
    assert len(third.turns[-1].replies) == 3 and noted.notes[-1] == SAME_SEED
    assert messages_from_pairs(back.pairs) == [{"role": "user", "content": "Hi"},
                                               {"role": "assistant", "content": "Hello!"}]
    assert first.switched(1) is None  # one reply: none to switch to
    # A new turn: its reply alone, the earlier turn's replies kept in the record.
    fourth, _ = answered(second, ran(second, "Bye", "Bye!", outcome(3, 50.0)))
    assert [len(turn.replies) for turn in fourth.turns] == [2, 1] and fourth.switched(1) is None


def test_a_compared_turn_keeps_both_sides_as_its_replies_the_shown_one_in_view():
    """A compared Chat turn: the other side first, the side shown last and in view; ◀ picks the
    other, which the conversation then goes on with."""
    from dataclasses import replace

    from engine.generate import Result
    from serve.outcome import Outcome
    from serve.running import ADAPTER_ON
    from ui.conversation import Conversation
    from ui.tabs.chat import answered

    def outcome(seed):
        return Outcome.done(Result("", seed, 5, 3, 80.0, "stop_string"), ADAPTER_ON, [], [])

    compared = replace(ran(Conversation(), "Hi", "Hello!", outcome(1)), other=("Good day.", outcome(2)))
    kept, shown = answered(Conversation("Bot is kind."), compared)
    turn = kept.turns[-1]
    assert [reply.text for reply in turn.replies] == ["Good day.", "Hello!"] and turn.shown == 1
    assert shown == outcome(1) and turn.replies[0].outcome == outcome(2)
    assert kept.switched(-1).pairs == [["Hi", "Good day."]]
    assert answered(kept, compared) is None  # kept once


def test_a_reload_brings_back_the_conversation_with_each_replys_outcome():
    """The record goes through the browser as JSON: read back, it is the same, each reply with its
    outcome; what an older version kept ({"persona", "history"}) is read without runs, and a
    record this app cannot read gives an empty conversation."""
    from engine.generate import Result
    from serve.messages import Message
    from serve.outcome import Outcome
    from serve.running import ADAPTER_ON
    from ui.conversation import Conversation, Reply, Turn
    from ui.tabs.chat import conversation_title, stored_conversation

    def outcome(seed):
        return Outcome.done(Result("", seed, 5, 3, 80.0, "stop_string"), ADAPTER_ON,
                            [("top_k", 20.0), ("stop", ("!", "\n\n"))], [Message.keyed("dropped_turn", count=1)])
    conversation = Conversation("Bot is kind.", (
        Turn("Hi", (Reply("Yo", outcome(3)),)),
        Turn("Hi again", (Reply("Hello!", outcome(1)), Reply("Good day.", outcome(2))), shown=1)))
    kept = json.loads(json.dumps({"conversation": conversation.as_json(), "adapter": True, "settings": {}}))
    assert stored_conversation(kept) == conversation
    assert kept["conversation"]["history"] == [["Hi", "Yo"], ["Hi again", "Good day."]]  # as /chat takes it
    assert conversation_title(kept) == "Hi (2)"
    older = {"history": [["Hi", "Yo"]], "persona": "Bot is kind.", "outcome": {"seed": 1}, "replies": {}}
    assert stored_conversation(older) == Conversation.from_pairs("Bot is kind.", [["Hi", "Yo"]])
    unreadable = {"conversation": {"persona": "", "turns": [{"user": "Hi", "replies": [], "shown": 0}]}}
    assert stored_conversation(unreadable) == Conversation() and stored_conversation({}) == Conversation()
    # an outcome this app cannot say (another version's) leaves its reply without one
    odd = json.loads(json.dumps(conversation.as_json()))
    odd["turns"][0]["replies"][0]["outcome"]["adapter"] = {"key": "no such key", "fields": []}
    assert Conversation.from_json(odd).turns[0].replies[0] == Reply("Yo")


def test_an_older_export_imports_as_a_conversation_without_runs(tmp_path):
    """An export from before the replies kept their runs ({"persona", "history"}) still imports:
    one reply a turn, none with an outcome; exported again, it gives the same history."""
    from ui.conversation import Conversation, Reply, Turn
    from ui.tabs.chat import read_import

    older = tmp_path / "conversation.json"
    older.write_text(json.dumps({"persona": "Bot is a sailor.", "history": [["Hello", "Ahoy!"], ["Where to?", ""]]}))
    conversation = read_import(str(older))
    assert conversation == Conversation("Bot is a sailor.", (Turn("Hello", (Reply("Ahoy!"),)),
                                                             Turn("Where to?", (Reply(""),))))
    assert conversation.as_json()["history"] == [["Hello", "Ahoy!"], ["Where to?", ""]]


def test_an_earlier_turn_is_drawn_again_exactly_from_its_record():
    """A turn run through the host, its reply recorded with its outcome, and a later turn after
    it: run again from the record (its seed and settings, the turns before it), the first turn's
    reply is the same."""
    from serve.apis import CHAT_API
    from ui.conversation import Conversation, Reply

    host = ModelHost(["bundled"], device="cpu")
    defaults = {name: param.default for name, param in CHAT_API.signature.parameters.items()}

    def run(values: dict):
        *_, (text, outcome, _, _) = host.run(CHAT_API, {**defaults, **values})
        assert outcome.ran, outcome
        return text, outcome

    asked = dict(message="Hi, I'd like to order a coffee, please.", history=[], persona="Bot is a barista.",
                 temperature=0.9, top_k=30, max_new_tokens=24, seed=1234, adapter=True, adapter_scale=0.5,
                 presence_penalty=0.4, frequency_penalty=0.2, stop="!\n\\n\\n")
    text, outcome = run(asked)
    conversation = Conversation("Bot is a barista.").answered(0, asked["message"], Reply(text, outcome))
    later, later_outcome = run({**asked, "message": "A latte.", "history": conversation.pairs, "seed": None})
    conversation = conversation.answered(1, "A latte.", Reply(later, later_outcome))
    again = conversation.replayed(0, CHAT_API.task)
    assert again["seed"] == 1234 and again["temperature"] == 0.9 and again["adapter_scale"] == 0.5
    assert (again["presence_penalty"], again["frequency_penalty"], again["stop"]) == (0.4, 0.2, ("!", "\n\n"))
    replayed, replayed_outcome = run(again)
    assert replayed == text and replayed_outcome.reproduces(outcome)
    assert run(conversation.replayed(1, CHAT_API.task))[0] == later  # a drawn seed is kept too
    assert Conversation.from_pairs("", [["Hi", "Yo"]]).replayed(0, CHAT_API.task) is None  # no run kept


def test_an_edits_draft_comes_back_once_the_message_box_is_empty_again():
    from ui.tabs.chat import draft_back

    assert draft_back("my draft", "") == ("my draft", "")  # the edited message has gone: back, and used up
    # a refused edit stays in the box: the draft waits, to come back after a later send
    assert draft_back("my draft", "the refused edit") == (gr.skip(), gr.skip())
    assert draft_back("", "") == (gr.skip(), gr.skip())  # no draft: the box is left as it is


def test_a_preset_sets_the_settings_it_holds_and_refuses_what_a_run_would():
    """Presets as the browser keeps them (ui/presets.py): saved and read back over the tab's
    opening settings; a setting this version has not is left out and named; a value a run would
    refuse, a store of another shape, a built-in preset's name, are refused or read as empty."""
    from serve import TASKS
    from serve.messages import Message, Refusal
    from ui.presets import MAX_PRESETS, preset_choices, preset_settings, with_preset, without_preset

    task = TASKS["generate"]
    opening = {"temperature": 1.0, "top_k": 40, "max_new_tokens": 100}
    stored, name = with_preset({"presets": {}}, "  Calm ", {**opening, "temperature": 0.7}, task)
    assert name == "Calm" and stored == {"presets": {"Calm": {**opening, "temperature": 0.7}}}
    assert preset_settings("Calm", stored, opening, task) == ({**opening, "temperature": 0.7}, [])
    assert preset_settings("Greedy", stored, opening, task) == ({**opening, "temperature": 0.0}, [])
    assert preset_choices(stored, "zh") == [("默认（内置）", "Default"), ("贪心（内置）", "Greedy"), ("Calm", "Calm")]
    # from another version: a setting this one has not is left out; one it has not saved takes the tab's own
    older = {"presets": {"Old": {"temperature": 0.5, "mirostat": 2}}}
    assert preset_settings("Old", older, opening, task) == ({**opening, "temperature": 0.5}, ["mirostat"])
    with pytest.raises(Refusal) as refused:
        preset_settings("Hot", {"presets": {"Hot": {"temperature": 9}}}, opening, task)
    assert refused.value.message == Message.keyed("preset_refused", preset="Hot", error=Message.keyed(
        "out_of_range", name="temperature", low=0.0, high=5.0, value="9"))
    for odd in ({"presets": {"Odd": [1, 2]}}, {"presets": "x"}, "not a store", None):
        with pytest.raises(Refusal) as refused:
            preset_settings("Odd", odd, opening, task)
        assert refused.value.message.key == "preset_unreadable"
    assert [name for _, name in preset_choices({"presets": "x"}, "en")] == ["Default", "Greedy"]  # read as empty
    for name, key in (("", "empty"), ("x" * 61, "too_big"), ("Default", "preset_built_in")):
        with pytest.raises(Refusal) as refused:
            with_preset(stored, name, opening, task)
        assert refused.value.message.key == key
    with pytest.raises(Refusal):  # a value a run would refuse is not saved either
        with_preset(stored, "Hot", {**opening, "top_k": 1.5}, task)
    full = {"presets": {str(n): opening for n in range(MAX_PRESETS)}}
    with pytest.raises(Refusal):
        with_preset(full, "one more", opening, task)
    assert with_preset(full, "0", opening, task)[0] == full  # replacing one is no more
    # a setting the tab gains joins the presets as it is, checked as a run checks it: stop strings
    ending = {**opening, "stop": "THE END"}
    saved, _ = with_preset({"presets": {}}, "Ends", ending, task)
    assert preset_settings("Ends", saved, {**opening, "stop": ""}, task) == (ending, [])
    with pytest.raises(Refusal):  # more stop strings than a run takes
        with_preset({"presets": {}}, "Many", {**opening, "stop": "\n".join("abcdefghi")}, task)
    assert without_preset(stored, "Calm") == {"presets": {}}
    for name, key in (("Greedy", "preset_built_in"), (None, "no_preset_picked"), ("Gone", "no_preset_picked")):
        with pytest.raises(Refusal) as refused:
            without_preset(stored, name)
        assert refused.value.message.key == key


def test_a_reply_edited_by_hand_goes_beside_the_one_drawn_and_says_so():
    """Conversation.edited: an edit of a drawn reply is shown beside it (◀ ▶ back to it), an edit
    of an edit replaces it, the turns after stay, and the next history holds the edited text; its
    outcome says it was edited (no seed to replay), through JSON too."""
    from engine.generate import Result
    from serve.outcome import EDITED, Outcome, status_line
    from ui.conversation import Conversation, Reply, Turn
    from serve.apis import CHAT_API
    from ui.tabs.chat import message_place

    task = CHAT_API.task
    drawn = Outcome.done(Result("", 3, 5, 3, 80.0, "stop_string"), None, [], [])
    conversation = Conversation("Bot is kind.", (Turn("Hi", (Reply("Yo", drawn),)), Turn("Bye", (Reply("Ciao", drawn),))))
    edited = conversation.edited(0, "Hello, friend.")
    assert edited.pairs == [["Hi", "Hello, friend."], ["Bye", "Ciao"]]
    first = edited.turns[0]
    assert [reply.text for reply in first.replies] == ["Yo", "Hello, friend."] and first.shown == 1
    assert first.reply.outcome == Outcome.edited() and first.reply.outcome.kind == EDITED
    assert edited.edited(0, "Hello!").turns[0].replies == (Reply("Yo", drawn), Reply("Hello!", Outcome.edited()))
    assert edited.edited(0, "Hello, friend.") == edited  # saved as it was
    assert edited.replayed(0, task) is None and edited.replayed(1, task) is not None
    assert Conversation.from_json(json.loads(json.dumps(edited.as_json()))) == edited
    assert status_line(Outcome.edited(), "en").startswith("edited by hand") and "⚠" not in status_line(Outcome.edited(), "en")
    # the Chatbot's messages: user, bot, user, bot; an empty reply is not drawn
    assert [message_place(edited, index) for index in range(5)] == [(0, True), (0, False), (1, True), (1, False),
                                                                     (2, True)]
    assert message_place(Conversation("", (Turn("Hi", (Reply(""),)), Turn("Bye", (Reply("Ciao"),)))), 1) == (1, True)

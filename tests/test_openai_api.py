"""OpenAI's /v1 API on the app's own server (serve/openai_api.py), driven by the real `openai`
client: completions and chat, streamed and not, with logprobs; a seed gives the same text twice and
the same text as the Gradio API; a stream sends a chunk per token; every model id answers on both
endpoints, an adapter's as its tab runs with the adapter on, with the tab's decoding defaults; bad
fields are 400s naming the field; a key, where set, is needed; a closed stream frees its decoding
row."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import openai
import pytest
from gradio_client import Client

from serve.model_host import BUNDLED, ModelHost
from tasks import TASKS, first_sentences

from .conftest import studio_app, wait_until

pytestmark = pytest.mark.slow  # the app served

SETTINGS = dict(temperature=0.8, top_p=1.0, max_tokens=12, seed=7)  # with top_k 40, as extra_body
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def served(app_models):
    host = ModelHost(app_models, device="cpu", allow_load=True)
    with studio_app(host) as (_, url):
        yield host, url


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    _, url = served
    return openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(served) -> str:
    host, _ = served
    return host.current.name


@pytest.fixture(scope="module")
def bundled_url() -> str:
    """The app serving the bundled model: a trained one, whose text is whole words and whose adapters
    do their tasks."""
    with studio_app(ModelHost([BUNDLED], device="cpu")) as (_, url):
        yield url


@pytest.fixture(scope="module")
def bundled_client(bundled_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{bundled_url.rstrip('/')}/v1", api_key="unused", max_retries=0)


def loops(text: str) -> bool:
    """Whether some three words in a row come three times: "train de train de train de"."""
    words = text.split()
    return any(count >= 3 for count in Counter(zip(words, words[1:], words[2:])).values())


def test_the_models_are_the_one_served_and_one_per_adapter(client, model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [model, f"{model}:dialogue", f"{model}:summarize", f"{model}:translate"]


def test_the_models_follow_a_load_and_an_unload(client, served, model, tiny_checkpoint):
    host, _ = served
    loaded = str(tiny_checkpoint)
    host.load(loaded)
    try:
        assert [m.id for m in client.models.list().data] == [loaded]  # it has no adapters
        assert client.completions.create(model=loaded, prompt=PROMPT, max_tokens=2, seed=1).choices[0].text
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=model, prompt=PROMPT, max_tokens=2)  # no longer served
    finally:
        host.unload(loaded)
    assert host.current.name == model and loaded not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(loaded)


def test_a_seeded_completion_repeats_and_is_what_the_gradio_api_gives(client, served, model):
    _, url = served
    first = client.completions.create(model=model, prompt=PROMPT, extra_body={"top_k": 40}, **SETTINGS)
    again = client.completions.create(model=model, prompt=PROMPT, extra_body={"top_k": 40}, **SETTINGS)
    text = first.choices[0].text
    assert text and text == again.choices[0].text
    assert first.system_fingerprint == "seed-7" and first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.completion_tokens <= 12 and first.usage.prompt_tokens == again.usage.prompt_tokens
    gradio_text, status, *_ = Client(url, verbose=False).predict(PROMPT, temperature=0.8, top_k=40, max_new_tokens=12,
                                                                 seed=7, api_name="/generate")
    assert status.startswith("seed 7 · ") and gradio_text == text


def test_completion_logprobs_echo_and_several_choices(client, served, model):
    host, _ = served
    done = client.completions.create(model=model, prompt=PROMPT, logprobs=3, echo=True, n=2, **SETTINGS)
    assert [choice.index for choice in done.choices] == [0, 1]
    first = done.choices[0]
    assert first.text.startswith(PROMPT)
    logprobs = first.logprobs
    # echoed, the prompt's tokens come first: the first follows nothing and has no log-probability
    k = len(host.current.tokenizer.encode(PROMPT))
    assert "".join(logprobs.tokens) == first.text and "".join(logprobs.tokens[:k]) == PROMPT
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) and all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(0 < len(top) <= 3 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset[k] == len(PROMPT) and logprobs.text_offset == sorted(logprobs.text_offset)
    # each further choice runs with the next seed: the first alone is the seed's own run
    alone = client.completions.create(model=model, prompt=PROMPT, **SETTINGS)
    assert alone.choices[0].text == first.text[len(PROMPT):]


def test_echoed_prompt_logprobs_are_the_models_own_as_transformers_gives_them(client, served, model, app_models):
    """What a harness reads to score a text (lm-eval sends echo, logprobs 1, max_tokens 1): each
    prompt token's log-probability after the ones before it, equal to transformers' on the same
    checkpoint; the adapter's model id scores under its adapter."""
    import torch
    from transformers import GPT2LMHeadModel

    host, _ = served
    text = "The quick brown fox jumps over the lazy dog."
    ids = host.current.tokenizer.encode(text)
    done = client.completions.create(model=model, prompt=text, echo=True, logprobs=1, max_tokens=1, temperature=0)
    logprobs = done.choices[0].logprobs
    with torch.no_grad():
        logits = GPT2LMHeadModel.from_pretrained(app_models[0])(torch.tensor([ids])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    expected = [float(reference[i, token]) for i, token in enumerate(ids[1:])]
    assert logprobs.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-4)
    best = [max(top.values()) for top in logprobs.top_logprobs[1:len(ids)]]
    assert best == pytest.approx(reference[:len(ids) - 1].max(dim=-1).values.tolist(), abs=1e-4)
    adapted = client.completions.create(model=f"{model}:summarize", prompt=text, echo=True, logprobs=1, max_tokens=1,
                                        temperature=0).choices[0].logprobs
    assert adapted.token_logprobs[1:len(ids)] != pytest.approx(expected, abs=1e-4)


def test_a_streamed_completion_is_the_same_text_in_pieces_then_its_usage(client, served, model):
    host, _ = served
    raw = client.completions.with_raw_response.create(model=model, prompt=PROMPT, **{**SETTINGS, "max_tokens": 30})
    assert raw.headers["x-decode-path"] == host.current.decode_path  # what else a seed's text depends on
    whole = raw.parse()
    *pieces, counts = client.completions.create(model=model, prompt=PROMPT, stream=True,
                                                stream_options={"include_usage": True},
                                                **{**SETTINGS, "max_tokens": 30})
    assert counts.choices == [] and counts.usage == whole.usage
    assert "".join(piece.choices[0].text for piece in pieces) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(piece.choices[0].finish_reason is None for piece in pieces[:-1])


def test_a_stream_sends_each_token_as_it_is_decoded(bundled_client):
    """A chunk per token, as OpenAI's and llama.cpp's servers send them (not the page's 12 updates a
    second), then the finish_reason in a chunk of its own and the usage. On the bundled model, whose
    tokens are whole characters: a piece of one would wait for the rest."""
    *pieces, finish, counts = bundled_client.completions.create(
        model=BUNDLED, prompt=PROMPT, stream=True, stream_options={"include_usage": True}, logprobs=0,
        **{**SETTINGS, "max_tokens": 40})
    assert len(pieces) == counts.usage.completion_tokens > 20
    assert [piece.choices[0].text for piece in pieces] == finish.choices[0].logprobs.tokens
    assert finish.choices[0].text == "" and finish.choices[0].finish_reason in ("stop", "length")


def test_chat_is_the_chat_tabs_reply_streamed_or_not(client, served, model):
    _, url = served
    messages = [{"role": "system", "content": "Bot is a friendly sailor."},
                {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "How are you?"}]
    settings = dict(temperature=0.8, max_tokens=20, seed=11)
    done = client.chat.completions.create(model=model, messages=messages, logprobs=True, top_logprobs=2, **settings)
    reply = done.choices[0].message.content
    assert reply and done.choices[0].message.role == "assistant"
    content = done.choices[0].logprobs.content
    assert content and all(len(token.top_logprobs) <= 2 and token.logprob <= 0 for token in content)
    streamed = client.chat.completions.create(model=model, messages=messages, stream=True, **settings)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == reply
    gradio_reply, status, prompt, _ = Client(url, verbose=False).predict(
        "How are you?", [["Hello", "Hi there!"]], "Bot is a friendly sailor.", temperature=0.8, top_k=0,
        no_repeat_ngram_size=0, max_new_tokens=20, seed=11, adapter=False, api_name="/chat")
    assert gradio_reply == reply and prompt.startswith("Bot is a friendly sailor.")


def test_an_adapters_model_id_runs_as_the_tab_runs_that_adapter(client, served, model):
    """`model:translate` on the Translate tab's adapter prompt gives the tab's translation."""
    _, url = served
    translation, _, prompt, _ = Client(url, verbose=False).predict(
        "The dog is happy.", "English", "French", None, seed=3, adapter=True, api_name="/translate")
    defaults = TASKS["translate"].defaults
    done = client.completions.create(model=f"{model}:translate", prompt=prompt, temperature=0, seed=3,
                                     max_tokens=defaults.max_new_tokens,
                                     extra_body={"repetition_penalty": defaults.repetition_penalty})
    assert first_sentences(1)(done.choices[0].text) == translation
    plain = client.completions.create(model=model, prompt=prompt, temperature=0, seed=3,
                                      max_tokens=defaults.max_new_tokens,
                                      extra_body={"repetition_penalty": defaults.repetition_penalty})
    assert plain.choices[0].text != done.choices[0].text  # the adapter is what made it


def test_every_listed_model_id_answers_on_both_endpoints(client, model):
    question = [{"role": "user", "content": "Where is the train station?"}]
    for model_id in [m.id for m in client.models.list().data]:
        done = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, seed=1)
        assert done.model == model_id and done.choices[0].text is not None
        chat = client.chat.completions.create(model=model_id, messages=question, max_tokens=4, seed=1)
        assert chat.model == model_id and chat.choices[0].message.content is not None


def test_a_chat_with_a_task_adapters_id_is_that_tabs_run_on_the_last_user_message(bundled_client, bundled_url):
    """`bundled:translate` translates the last user message (English to French by default), with the
    Translate tab's repetition penalty, which stops the loop it fell into without it; and
    `bundled:summarize` summarises it with the Summarise tab's sampling, seed for seed."""
    question = "Where is the train station?"
    gradio = Client(bundled_url, verbose=False)
    tab, *_ = gradio.predict(question, "English", "French", None, adapter=True, api_name="/translate")
    chat = bundled_client.chat.completions.create(model=f"{BUNDLED}:translate", messages=[
        {"role": "system", "content": "You translate."}, {"role": "user", "content": question}])
    assert chat.choices[0].message.content == tab and tab.startswith("Où est") and not loops(tab)
    assert chat.choices[0].finish_reason == "stop"
    german, *_ = gradio.predict(question, "English", "German", None, adapter=True, api_name="/translate")
    assert bundled_client.chat.completions.create(model=f"{BUNDLED}:translate", extra_body={"target": "German"},
                                                  messages=[{"role": "user", "content": question}]
                                                  ).choices[0].message.content == german
    article = ("Lily found a little dog in the park. It was cold and hungry. She took it home, gave it warm milk "
               "and a blanket, and her mother said the dog could stay.")
    summary, *_ = gradio.predict(article, seed=5, adapter=True, api_name="/summarize")
    assert bundled_client.chat.completions.create(model=f"{BUNDLED}:summarize", seed=5, messages=[
        {"role": "user", "content": article}]).choices[0].message.content == summary


def test_a_completion_with_a_task_adapters_id_takes_its_tabs_decoding_defaults(bundled_client):
    """The prompt as written, in the adapter's format here; the settings the request leaves unset are
    the Translate tab's, whose repetition penalty keeps greedy decoding out of a loop."""
    def translation(**settings) -> str:
        return bundled_client.completions.create(model=f"{BUNDLED}:translate", extra_body=settings,
                                                 prompt="English: Where is the train station?\nFrench:").choices[0].text
    defaults = TASKS["translate"].defaults
    text = translation()
    assert text == translation(temperature=0, repetition_penalty=defaults.repetition_penalty,
                               max_tokens=defaults.max_new_tokens)
    assert text.startswith(" Où est") and not loops(text) and loops(translation(repetition_penalty=1.0))


@pytest.mark.parametrize("request_, param", [
    (dict(temperature=99), "temperature"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n"),
    (dict(logprobs=21), "logprobs"),
    (dict(top_p=0), "top_p"),
    (dict(seed=-5), "seed"),
    (dict(stop=[1, 2]), "stop"),
    (dict(prompt="word " * 5000), "prompt"),
    (dict(extra_body={"min_p": 2}), "min_p"),
    (dict(max_tokens=600), "max_tokens"),  # the app's limit, as the page's, not the engine's
    (dict(temperature=0.005), "temperature"),  # the engine's own check: between greedy and sampling
    (dict(stop=[f"x{i}" for i in range(9)]), "stop"),
    (dict(stop="x" * 101), "stop"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty="high"), "frequency_penalty"),
])
def test_a_bad_field_is_a_400_that_names_it_and_the_server_goes_on(client, model, request_, param):
    request_ = {"prompt": PROMPT, **request_}
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, **request_)
    assert refused.value.body["param"] == param, refused.value.body
    assert client.completions.create(model=model, prompt=PROMPT, max_tokens=2).choices[0].text is not None


def test_the_limits_a_refusal_gives_are_the_ones_that_hold(client, model):
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=600)
    assert "max_tokens must be between 1 and 512" in long.value.body["message"]
    assert client.completions.create(model=model, prompt=PROMPT, max_tokens=512, temperature=0).usage
    with pytest.raises(openai.BadRequestError) as many:  # the chat's two speaker tags count
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       stop=[f"x{i}" for i in range(7)])
    assert "at most 6 " in many.value.body["message"]
    assert client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          stop=[f"x{i}" for i in range(6)], max_tokens=2).choices
    # the dialogue adapter's line end counts too
    with pytest.raises(openai.BadRequestError) as with_adapter:
        client.chat.completions.create(model=f"{model}:dialogue", messages=[{"role": "user", "content": "Hi"}],
                                       stop=[f"x{i}" for i in range(6)])
    assert "at most 5 " in with_adapter.value.body["message"] and with_adapter.value.body["param"] == "stop"


def test_stop_as_one_string_cuts_the_text_there(client, model):
    free = client.completions.create(model=model, prompt=PROMPT, temperature=0, max_tokens=20).choices[0].text
    word = free[len(free) // 2:][:3]  # from the middle of what it wrote (a tiny random model writes few spaces)
    assert len(word) == 3 and "\ufffd" not in word, free
    cut = client.completions.create(model=model, prompt=PROMPT, temperature=0, max_tokens=20, stop=word).choices[0]
    assert cut.text == free[:free.index(word)] and cut.finish_reason == "stop"


def test_presence_and_frequency_penalties_and_a_stop_list_apply_as_the_gradio_api_applies_them(client, served, model):
    """OpenAI's presence_penalty and frequency_penalty change the text, to what /generate gives with
    the same settings; with a stop list, the text ends before the first stop written. Chat takes
    them too."""
    _, url = served
    greedy = dict(model=model, prompt=PROMPT, temperature=0, max_tokens=20, seed=3)
    free = client.completions.create(**greedy).choices[0].text
    penalised = client.completions.create(**greedy, presence_penalty=1.5, frequency_penalty=2.0).choices[0].text
    assert penalised != free
    gradio_text, status, *_ = Client(url, verbose=False).predict(
        PROMPT, temperature=0, max_new_tokens=20, seed=3, presence_penalty=1.5, frequency_penalty=2.0,
        api_name="/generate")
    assert gradio_text == penalised and "presence_penalty 1.5, frequency_penalty 2" in status
    word = penalised[len(penalised) // 2:][:3]
    assert len(word) == 3 and "\ufffd" not in word, penalised
    cut = client.completions.create(**greedy, presence_penalty=1.5, frequency_penalty=2.0,
                                    stop=["never written", word]).choices[0]
    assert cut.text == penalised[:penalised.index(word)] and cut.finish_reason == "stop"
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], temperature=0,
                                           presence_penalty=-2, frequency_penalty=2, stop=["\n\n"], max_tokens=4)
    assert reply.choices[0].message.content is not None


def test_logprobs_without_alternatives_still_give_each_tokens_own(client, model):
    done = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, logprobs=0, seed=2)
    logprobs = done.choices[0].logprobs
    assert "".join(logprobs.tokens) == done.choices[0].text and len(logprobs.token_logprobs) == len(logprobs.tokens)
    assert all(top == {} for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                          logprobs=True, seed=2)
    content = chat.choices[0].logprobs.content
    assert content and all(token.top_logprobs == [] and token.logprob <= 0 for token in content)


def test_a_chat_stream_names_the_role_once_as_openais_does(client, served, model):
    _, url = served
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "seed": 5,
            "stream": True}
    with httpx.stream("POST", f"{url.rstrip('/')}/v1/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert len(deltas) > 1 and deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    # so the client's own stream helper joins them into one message as it would OpenAI's
    with client.chat.completions.stream(model=model, messages=body["messages"], max_tokens=12, seed=5) as stream:
        for _ in stream:
            pass
        final = stream.current_completion_snapshot  # get_final_completion refuses a reply cut by max_tokens
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content == "".join(d.get("content") or "" for d in deltas)


def test_chat_through_v1_runs_with_openais_defaults_not_the_tabs(client, model):
    """The docs' promise: the extra settings (the tab's 3-gram block among them) are off unless sent."""
    messages = [{"role": "user", "content": "Tell me a story"}]
    def reply(**extra):
        return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=40,
                                              extra_body=extra).choices[0].message.content
    assert reply() == reply(no_repeat_ngram_size=0) != reply(no_repeat_ngram_size=3)


def test_user_messages_in_a_row_are_one_turn(client, model):
    def reply(*said: str):
        done = client.chat.completions.create(model=model, messages=[{"role": "user", "content": s} for s in said],
                                              max_tokens=8, seed=3)
        return done.choices[0].message.content, done.usage.prompt_tokens
    assert reply("Hello.", "How are you?") == reply("Hello. How are you?")


def test_chat_replies_by_default_as_long_as_the_chat_tab_lets_them(client, served, model):
    """Not OpenAI's 16 tokens of a completion, which cut replies off mid-sentence: the tab's cap."""
    _, url = served
    done = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], seed=4)
    gradio_reply, *_ = Client(url, verbose=False).predict(
        "Hello", [], "", temperature=1.0, top_k=0, no_repeat_ngram_size=0, seed=4, adapter=False, api_name="/chat")
    assert done.choices[0].message.content == gradio_reply and done.usage.completion_tokens > 16


def test_an_unknown_route_answers_in_openais_shape(client):
    for method, path in (("GET", "nothing"), ("GET", "completions"), ("DELETE", "models")):
        response = httpx.request(method, f"{client.base_url}{path}")
        assert response.status_code == 404 and "/v1/chat/completions" in response.json()["error"]["message"]


def test_bad_chat_messages_and_an_unknown_model_are_refused(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=[])
    assert refused.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError):  # the last message must be the user's
        client.chat.completions.create(model=model, messages=[{"role": "assistant", "content": "Hi"}])
    with pytest.raises(openai.BadRequestError) as language:
        client.chat.completions.create(model=f"{model}:translate", messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"target": "Klingon"})
    assert language.value.body["param"] == "target"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="gpt-4", prompt=PROMPT)
    assert unknown.value.body["param"] == "model" and model in unknown.value.body["message"]
    missing = httpx.post(f"{client.base_url}completions", json={"prompt": PROMPT})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    # one model's own route, as the client's models.retrieve asks it
    assert client.models.retrieve(f"{model}:translate").id == f"{model}:translate"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_a_closed_stream_frees_its_decoding_row(client, served, model):
    host, _ = served
    scheduler = host.current.scheduler
    stream = client.completions.create(model=model, prompt=PROMPT, stream=True, max_tokens=500, temperature=1.0)
    next(iter(stream))
    assert scheduler.rows_in_use == 1
    stream.close()
    assert wait_until(lambda: scheduler.rows_in_use == 0, timeout_s=20)


def test_with_an_api_key_a_v1_request_needs_it_and_the_page_does_not(app_models):
    with studio_app(app_models[:1], api_key="sesame") as (_, url):
        base = f"{url.rstrip('/')}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        assert httpx.get(f"{base}/models").status_code == 401
        assert openai.OpenAI(base_url=base, api_key="sesame", max_retries=0).models.list().data
        assert httpx.get(url).status_code == 200  # the page itself needs no key


def test_past_its_capacity_a_request_is_told_to_retry_and_a_loading_model_to_wait(app_models):
    host = ModelHost(app_models[:2], device="cpu", concurrency=1, queue_size=0)
    with studio_app(host) as (_, url):
        client = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="unused", max_retries=0)
        model = host.current.name
        holding = client.completions.create(model=model, prompt=PROMPT, stream=True, max_tokens=500)
        next(iter(holding))  # one request decoding: the capacity
        with pytest.raises(openai.RateLimitError) as full:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=2)
        assert full.value.response.headers["retry-after"]
        holding.close()

        def answered() -> bool:
            try:
                return client.completions.create(model=model, prompt=PROMPT, max_tokens=2) is not None
            except openai.RateLimitError:
                return False
        assert wait_until(answered, timeout_s=20)  # the closed stream gave its place back
        host.loading = host.names[1]  # as while the model panel loads it
        try:
            with pytest.raises(openai.InternalServerError) as loading:
                client.completions.create(model=host.names[1], prompt=PROMPT, max_tokens=2)
            assert loading.value.status_code == 503 and loading.value.response.headers["retry-after"]
        finally:
            host.loading = None

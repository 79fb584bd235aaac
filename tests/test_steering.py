"""Steering (engine/steering.py): a vector from pairs of texts, added after block L per request and
per batch row, on the decode kernels and on PyTorch; and its parameters in the APIs."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from engine import kernels
from engine.cache import new_cache
from engine.generate import SamplingParams, decode_tokens
from engine.residual import residual_stream
from engine.scheduler import Scheduler
from engine.steering import Steering, steered, steering_vector
from model import load_pretrained
from model.adapters import active_adapter

from .conftest import serving

POSITIVE = ["I love this, it is wonderful.", "The day was happy and bright.", "What a great friend."]
NEGATIVE = ["I hate this, it is awful.", "The day was sad and dark.", "What a terrible enemy."]


@pytest.fixture(scope="module")
def loaded(adapter_checkpoint):
    return serving(load_pretrained(adapter_checkpoint))


def vector_at(loaded, layer: int, positive=POSITIVE, negative=NEGATIVE) -> torch.Tensor:
    model, tokenizer = loaded
    return steering_vector(model, tokenizer, positive, negative, layer)[0]


def tokens_of(model, ids: list[int], params: SamplingParams, steering=None, adapter=None) -> list[int]:
    return [int(t[0]) for t in decode_tokens(model, [ids], params, [params.seed], adapter=adapter, steering=steering)]


# --- the vector ---------------------------------------------------------------------------------

def test_the_vector_is_the_mean_of_the_pairs_differences_at_their_last_tokens(loaded):
    model, tokenizer = loaded
    layer = 1
    vector, typical = steering_vector(model, tokenizer, POSITIVE, NEGATIVE, layer)
    with torch.no_grad():
        last = {text: residual_stream(model, torch.tensor([tokenizer.encode(text)]))[0][layer][0, -1]
                for text in POSITIVE + NEGATIVE}
    expected = torch.stack([last[p] - last[n] for p, n in zip(POSITIVE, NEGATIVE)]).mean(dim=0)
    assert vector.shape == (model.config.n_embd,)
    assert torch.allclose(vector, expected, atol=1e-5)
    assert typical > 0 and vector.norm() > 0
    one, _ = steering_vector(model, tokenizer, POSITIVE[0], NEGATIVE[0], layer)
    assert torch.allclose(one, last[POSITIVE[0]] - last[NEGATIVE[0]], atol=1e-5)


def test_identical_positive_and_negative_give_a_zero_vector(loaded):
    for layer in (0, 1, 2):
        assert torch.count_nonzero(vector_at(loaded, layer, POSITIVE, POSITIVE)) == 0


def test_pairs_must_match(loaded):
    model, tokenizer = loaded
    with pytest.raises(ValueError, match="pairs"):
        steering_vector(model, tokenizer, POSITIVE, NEGATIVE[:2], 1)
    with pytest.raises(ValueError, match="layer"):
        steering_vector(model, tokenizer, POSITIVE, NEGATIVE, model.config.n_layer + 1)


# --- adding it ----------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [0, 1, 2])
@torch.no_grad()
def test_strength_times_the_vector_is_added_after_block_l_at_every_position(loaded, layer):
    """The residual stream before block L is unchanged; after it, each position gets alpha * v
    (and the blocks after it carry the change on)."""
    model, tokenizer = loaded
    ids = torch.tensor([tokenizer.encode("Once upon a time, there was a little girl")])
    vector = vector_at(loaded, layer)
    plain, plain_logits = residual_stream(model, ids)
    with steered(model, Steering(layer, vector, 2.0)):
        steered_stream, steered_logits = residual_stream(model, ids)
    for before in range(layer):
        assert torch.equal(steered_stream[before], plain[before])
    # at L=0 the recorded embeddings are wte + wpe, read before the hook adds the vector
    if layer > 0:
        assert torch.allclose(steered_stream[layer], plain[layer] + 2.0 * vector, atol=1e-5)
    assert not torch.allclose(steered_logits, plain_logits, atol=1e-3)


@torch.no_grad()
def test_strength_zero_is_the_run_without_steering_bit_for_bit(loaded):
    model, tokenizer = loaded
    ids = tokenizer.encode("The cat sat on the mat.")
    vector = vector_at(loaded, 1)
    plain = model(torch.tensor([ids]))
    with steered(model, Steering(1, vector, 0.0)):
        assert torch.equal(model(torch.tensor([ids])), plain)
    params = SamplingParams(temperature=1.0, top_k=20, seed=7, max_new_tokens=20)
    assert tokens_of(model, ids, params, Steering(1, vector, 0.0)) == tokens_of(model, ids, params)
    steered_tokens = tokens_of(model, ids, params, Steering(1, vector, 4.0))
    assert steered_tokens != tokens_of(model, ids, params)
    assert steered_tokens == tokens_of(model, ids, params, Steering(1, vector, 4.0))  # seeded: reproducible


@torch.no_grad()
def test_each_row_of_a_batch_gets_its_own_steering(loaded):
    model, tokenizer = loaded
    ids = torch.randint(0, model.config.vocab_size, (4, 10), generator=torch.Generator().manual_seed(2))
    rows = [Steering(1, vector_at(loaded, 1), 3.0), None, Steering(2, vector_at(loaded, 2), -2.0),
            Steering(0, vector_at(loaded, 0), 1.5)]
    with steered(model, rows):
        batch = model(ids)
    for row, steering in enumerate(rows):
        with steered(model, steering):
            assert torch.allclose(batch[row], model(ids[row:row + 1])[0], atol=1e-5), row
    assert torch.equal(batch[1], model(ids)[1])  # the row without steering: untouched


# --- in the scheduler's batch -------------------------------------------------------------------

def mixed_requests(loaded) -> list[tuple[str, SamplingParams, str | None, Steering | None]]:
    one, two, zero = vector_at(loaded, 1), vector_at(loaded, 2), vector_at(loaded, 0)
    return [
        ("Once upon a time", SamplingParams(temperature=0, max_new_tokens=24), None, Steering(1, one, 3.0)),
        ("The cat sat", SamplingParams(temperature=0.8, top_k=40, seed=11, max_new_tokens=20), "summarize", None),
        ("In the beginning", SamplingParams(temperature=1.0, seed=12, max_new_tokens=22), "translate",
         Steering(2, two, -2.0)),
        ("Hello", SamplingParams(temperature=0, max_new_tokens=18), None, None),
        ("A long time ago", SamplingParams(temperature=1.0, seed=13, max_new_tokens=20), None, Steering(0, zero, 1.5)),
        ("Yes", SamplingParams(temperature=0.7, top_k=5, seed=14, max_new_tokens=16), "summarize",
         Steering(1, one, 0.0)),
    ]


def test_a_batch_mixing_steered_unsteered_and_adapter_rows_gives_each_row_its_text_alone(loaded):
    model, tokenizer = loaded
    requests = mixed_requests(loaded)
    scheduler = Scheduler(model, max_batch=8)
    streams = [scheduler.decode(tokenizer.encode(prompt), params, params.seed or 0, adapter=adapter,
                                steering=steering) for prompt, params, adapter, steering in requests]
    outputs = [[int(t[0]) for t in s] for s in streams]
    assert scheduler.largest_batch >= 5
    for (prompt, params, adapter, steering), output in zip(requests, outputs):
        alone = tokens_of(model, tokenizer.encode(prompt), replace(params, seed=params.seed or 0), steering, adapter)
        assert output == alone, prompt
    unsteered = tokens_of(model, tokenizer.encode("Once upon a time"), replace(requests[0][1], seed=0))
    assert outputs[0] != unsteered  # the steering did change it


# --- on the decode kernels ----------------------------------------------------------------------

def decode_logits(model, ids: torch.Tensor, steps: torch.Tensor, rows, adapters) -> torch.Tensor:
    """Each row prefilled alone (its own steering and adapter), then decode steps for all at once."""
    cache = new_cache(model, len(rows), ids.shape[1] + steps.shape[1])
    for row, (steering, adapter) in enumerate(zip(rows, adapters)):
        alone = new_cache(model, 1, ids.shape[1])
        with steered(model, steering), active_adapter(adapter):
            model(ids[row:row + 1], cache=alone)
        cache.copy_row(row, alone)
    with steered(model, rows), active_adapter(adapters):
        return torch.cat([model(steps[:, i:i + 1], cache=cache) for i in range(steps.shape[1])], dim=1)


@pytest.mark.slow  # the decode kernels (built first)
@torch.inference_mode()
def test_the_kernels_and_pytorch_agree_under_steering_and_a_row_has_its_bits_alone(loaded):
    model, _ = loaded
    assert kernels.decode_kernels() is not None, kernels.decode_path()
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(0, model.config.vocab_size, (6, 7), generator=generator)
    steps = torch.randint(0, model.config.vocab_size, (6, 4), generator=generator)
    rows = [Steering(1, vector_at(loaded, 1), 3.0), None, Steering(2, vector_at(loaded, 2), -2.0),
            Steering(0, vector_at(loaded, 0), 1.5), None, Steering(1, vector_at(loaded, 1), 1.0)]
    adapters = ["summarize", None, None, "translate", "summarize", None]
    on_kernels = decode_logits(model, ids, steps, rows, adapters)
    with kernels.switched_off():
        on_pytorch = decode_logits(model, ids, steps, rows, adapters)
        unsteered = decode_logits(model, ids, steps, [None] * len(rows), adapters)
    assert (on_kernels - on_pytorch).abs().max() <= 1e-5 * on_pytorch.abs().max()
    assert not torch.allclose(on_pytorch[0], unsteered[0], atol=1e-3)
    for row in range(len(rows)):
        alone = decode_logits(model, ids[row:row + 1], steps[row:row + 1], rows[row:row + 1], adapters[row:row + 1])
        assert torch.equal(alone[0], on_kernels[row]), row


# --- the APIs -----------------------------------------------------------------------------------

STEER = dict(steer_positive="\n".join(POSITIVE), steer_negative="\n".join(NEGATIVE), steer_layer=1,
             steer_strength=4.0)


@pytest.fixture(scope="module")
def host(app_models):
    from serve.model_host import ModelHost

    return ModelHost(app_models[:1], device="cpu")


def final_of(host, api_name: str, **values):
    """(text, status line) of a run through the Gradio API's endpoint function."""
    from serve.apis import APIS
    from ui.api import api_endpoint

    *_, (text, status, _, _) = api_endpoint(APIS[api_name], host)(**values)
    return text, status


def test_every_task_endpoint_takes_the_steering_parameters():
    from serve.apis import APIS

    for api in APIS.values():
        parameters = api.signature.parameters
        assert {name: parameters[name].default for name in STEER} == {
            "steer_positive": "", "steer_negative": "", "steer_layer": None, "steer_strength": 0.0}, api.name


def test_a_steered_run_through_the_api_names_its_steering_and_reproduces(host):
    prompt = dict(prompt="Once upon a time", max_new_tokens=16, seed=7)
    plain, plain_status = final_of(host, "generate", **prompt)
    text, status = final_of(host, "generate", **prompt, **STEER)
    assert text != plain and "steered" not in plain_status
    assert "steered at layer 1, strength 4: 3 pairs, vector norm" in status
    assert final_of(host, "generate", **prompt, **STEER)[0] == text  # seeded: reproducible
    # strength 0, or empty texts: the run without steering, bit for bit
    assert final_of(host, "generate", **prompt, **{**STEER, "steer_strength": 0})[0] == plain
    assert final_of(host, "generate", **prompt, **{**STEER, "steer_positive": "", "steer_negative": ""})[0] == plain
    # the default layer: the model's middle one
    _, middle = final_of(host, "generate", **prompt, **{**STEER, "steer_layer": None})
    assert f"layer {host.current.config.n_layer // 2}," in middle


def test_the_outcome_record_keeps_the_steering_and_asks_for_it_again(host):
    from serve.apis import APIS
    from serve.outcome import Outcome
    from serve.running import asked_again

    api = APIS["summarize"]
    values = {**{p.name: p.default for p in api.signature.parameters.values()},
              "article": "The sun rose over the hill. A little bird began to sing.", "seed": 3, **STEER}
    *_, (text, outcome, _, _) = host.run(api, values)
    assert outcome.ran and outcome.steering.field("layer") == 1
    assert Outcome.from_json(outcome.as_json()) == outcome
    again = {**values, **asked_again(outcome, api.task)}
    *_, (text_again, outcome_again, _, _) = host.run(api, again)
    assert text_again == text and outcome_again.reproduces(outcome)
    assert asked_again(replace(outcome, steering=None), api.task)["steer_strength"] == 0


@pytest.mark.parametrize("change,key,name", [
    (dict(steer_layer=3), "out_of_range", "steer_layer"),  # the model has 2 blocks
    (dict(steer_strength=11), "out_of_range", "steer_strength"),
    (dict(steer_negative="one line"), "steer_pairs", None),
    (dict(steer_positive="x" * 4001), "too_big", "steer_positive"),
    (dict(steer_positive=5), "not_text", "steer_positive"),
])
def test_bad_steering_is_refused_naming_its_field(host, change, key, name):
    from serve.apis import APIS

    api = APIS["generate"]
    values = {**{p.name: p.default for p in api.signature.parameters.values()}, "prompt": "Hello", **STEER, **change}
    *_, (_, outcome, _, _) = host.run(api, values)
    assert not outcome.ran and outcome.message.key == key and outcome.message.field("name") == name


def test_v1_takes_steering_in_the_body_and_studio_passes_it_through(host):
    import openai
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serve.openai_api import openai_routes
    from serve.page_api import page_routes

    server = FastAPI()
    server.include_router(openai_routes(host))
    server.include_router(page_routes(host))
    http = TestClient(server)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
    model, settings = host.current.name, dict(prompt="Once upon a time", max_tokens=16, temperature=0, seed=7)
    steering = {"positive": STEER["steer_positive"], "negative": STEER["steer_negative"], "layer": 1, "strength": 4}
    plain = client.completions.create(model=model, **settings).choices[0].text
    steered_text = client.completions.create(model=model, **settings, extra_body={"steering": steering}).choices[0].text
    assert steered_text != plain
    assert client.completions.create(model=model, **settings,
                                     extra_body={"steering": steering}).choices[0].text == steered_text
    off = client.completions.create(model=model, **settings, extra_body={"steering": {**steering, "strength": 0}})
    assert off.choices[0].text == plain
    for bad in ({**steering, "layer": 9}, {**steering, "negative": "one"}, "love", {**steering, "alpha": 1}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=model, **settings, extra_body={"steering": bad})
        assert refused.value.body["param"] == "steering"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                          seed=7, extra_body={"steering": steering})
    assert chat.choices[0].message.content is not None
    # /studio: the page's values, steering among them, as the Gradio endpoints take them
    from serve.apis import APIS

    values = {**{p.name: p.default for p in APIS["generate"].signature.parameters.values()},
              "prompt": "Once upon a time", "max_new_tokens": 16, "seed": 7}
    last = [json.loads(line) for line in http.post("/studio/run/generate", json={**values, **STEER}).text.splitlines()]
    plain_last = [json.loads(line) for line in http.post("/studio/run/generate", json=values).text.splitlines()]
    assert last[-1]["outcome"]["steering"]["key"] == "steered" and plain_last[-1]["outcome"]["steering"] is None
    assert last[-1]["text"] != plain_last[-1]["text"]


def test_v1_echoes_the_prompts_logprobs_under_the_requests_steering(host):
    """echo with logprobs scores the prompt as the request runs: steered where it steers (each
    token but the first changes), as without steering for strength 0."""
    import openai
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serve.openai_api import openai_routes

    server = FastAPI()
    server.include_router(openai_routes(host))
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=TestClient(server),
                           max_retries=0)
    steering = {"positive": STEER["steer_positive"], "negative": STEER["steer_negative"], "layer": 1, "strength": 4}

    def echoed(**extra) -> list:
        done = client.completions.create(model=host.current.name, prompt="Once upon a time there was a cat",
                                         max_tokens=1, temperature=0, echo=True, logprobs=3, extra_body=extra)
        logprobs = done.choices[0].logprobs
        return [logprobs.token_logprobs, logprobs.top_logprobs]

    plain = echoed()
    steered_scores, steered_top = echoed(steering=steering)
    assert steered_scores[0] is None and all(a != b for a, b in zip(plain[0][1:], steered_scores[1:]))
    assert steered_top[1:] != plain[1][1:]
    assert echoed(steering={**steering, "strength": 0}) == plain


def test_a_steered_compare_is_steering_off_and_on_under_one_seed(host):
    """With a strength set, Compare runs the request unsteered and steered (the adapter as its switch
    says) under one seed: each side is the run alone, the first token where they part is marked,
    and the line is the steered side's, naming the steering and the comparison."""
    from serve.apis import APIS
    from serve.outcome import english_status

    api, prompt = APIS["generate"], dict(prompt="Once upon a time", max_new_tokens=16, seed=7)
    *_, (texts, outcome, comparison) = host.run_compare(api, {**prompt, **STEER, "compare": "steering"})
    assert comparison.axis == "steering" and comparison.shown == 1
    assert comparison.asked == ({"steer_strength": 0.0}, {})
    assert texts == [final_of(host, "generate", **prompt)[0], final_of(host, "generate", **prompt, **STEER)[0]]
    assert texts[0] != texts[1] and comparison.diverges_at[0] is not None
    status = english_status(outcome)
    assert "steered at layer 1, strength 4" in status
    assert "unsteered vs steered: the output and counts are with steered" in status

"""The comparison's APIs: the Gradio endpoint /compare (task, compare, values) through
gradio_client, and POST /studio/compare/{api_name} (compare in the body with the task's values)
through httpx, also behind a page in front of replicas (serve/backend.py)."""
from __future__ import annotations

import itertools
import json

import pytest

from serve.admission import RunQueue
from serve.apis import APIS

from .conftest import make_hf_checkpoint, serve_studio

pytestmark = pytest.mark.slow  # Gradio's import, the app served, the decode kernels (built first)

STORY = {"prompt": "Once upon a time", "max_new_tokens": 12, "temperature": 1.0, "seed": 5}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    """A small checkpoint saved twice (two names, the same weights), and the bundled model, whose
    tokenizer (SentencePiece) is another."""
    root = tmp_path_factory.mktemp("compare-api")
    shape = dict(n_positions=1024, n_embd=64, n_layer=2, n_head=2)  # room for every task's prompt
    return [*(str(make_hf_checkpoint(root / name, seed=3, **shape)) for name in ("first", "second")), "bundled"]


@pytest.fixture(scope="module")
def host(models):
    from serve.model_host import ModelHost
    return ModelHost(models, device="cpu")


@pytest.fixture(scope="module")
def client(host):
    from gradio_client import Client

    with serve_studio(host) as url:
        yield Client(url, verbose=False)


def compare(client, compare: str, task: str = "generate", **values) -> dict:
    return client.predict(task=task, compare=compare, values={**STORY, **values}, api_name="/compare")


def test_compare_is_an_endpoint_named_by_its_parameters(client):
    endpoint = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/compare"]
    assert [p["parameter_name"] for p in endpoint["parameters"]] == ["task", "compare", "values"]


def test_two_identical_models_give_identical_sides_bit_for_bit(client, models):
    answer = compare(client, f"model:{models[1]}")
    first, second = answer["sides"]
    assert first["text"] == second["text"] and first["text"]
    assert first["logprobs"] == second["logprobs"] and first["logprobs"]  # every float the same
    assert answer["first_difference"] is None and not answer["by_text"]
    assert [first["label"], second["label"]] == [f"model {models[0]}", f"model {models[1]}"]
    assert answer["status"].startswith("seed 5 · ") and " tokens/s" in first["status"] and " tokens/s" in second["status"]
    assert answer["compare"] == f"model:{models[1]}" and answer["shown"] == 0


def test_a_no_op_setting_gives_identical_sides_and_a_real_one_parts(client, host):
    same = compare(client, "setting:top_k=0", top_k=0)
    assert same["sides"][0]["logprobs"] == same["sides"][1]["logprobs"] and same["first_difference"] is None
    parted = compare(client, "setting:temperature=0.7")
    assert [side["label"] for side in parted["sides"]] == ["temperature 1", "temperature 0.7"]
    at = parted["first_difference"]
    assert isinstance(at, int) and [side["first_difference"] for side in parted["sides"]] == [at, at]
    tokens = [[entry["bytes"] for entry in side["logprobs"]] for side in parted["sides"]]
    assert tokens[0][:at] == tokens[1][:at] and tokens[0][at:at + 1] != tokens[1][at:at + 1]
    # each side is the request run alone with its settings, under the same seed
    alone = client.predict(**{**STORY, "temperature": 0.7}, api_name="/generate")[0]
    assert parted["sides"][1]["text"] == alone
    assert len(parted["sides"][0]["under_other"]) == len(tokens[0])


def test_models_of_different_tokenizers_mark_the_first_difference_by_text(client):
    answer = compare(client, "model:bundled", temperature=0)
    assert answer["by_text"] and answer["sides"][1]["label"] == "model bundled"
    texts = ["".join(bytes(b for entry in side["logprobs"] for b in entry["bytes"]).decode(errors="replace"))
             for side in answer["sides"]]
    character = answer["first_difference_character"]
    assert texts[0][:character] == texts[1][:character] and texts[0][character:] != texts[1][character:]
    assert answer["first_difference"] == answer["sides"][0]["first_difference"]
    for side, text in zip(answer["sides"], texts):  # each side's first differing token holds that character
        ends = itertools.accumulate(len(bytes(b for b in entry["bytes"]).decode(errors="replace"))
                                    for entry in side["logprobs"])
        assert side["first_difference"] == next(i for i, end in enumerate(ends) if end > character)
    assert all(side["under_other"] is None for side in answer["sides"])


def test_every_task_compares(client):
    for task, values in (("chat", {"message": "Hi!", "history": [["Hello", "Hi there."]]}),
                         ("translate", {"text": "The cat sleeps.", "target": "German"}),
                         ("summarize", {"article": "The sun rose. A bird sang. The fox slept."})):
        answer = client.predict(task=task, compare="setting:max_new_tokens=4", values={**values, "seed": 2},
                                api_name="/compare")
        assert answer["sides"][1]["label"] == "max_new_tokens 4" and answer["status"].startswith("seed 2 · ")
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="this model has no 'summarize' adapter"):  # neither twin has one
        client.predict(task="summarize", compare="adapter", values={"article": "The sun rose."}, api_name="/compare")


@pytest.mark.parametrize("task, compare_, values, said", [
    ("generate", "model:gpt2-xl", STORY, "compare names the model gpt2-xl, which is not one of the models here"),
    ("generate", "setting:warmth=2", STORY, "compare names the setting warmth, which is not a decoding setting"),
    ("generate", "setting:top_p=3", STORY, "compare: top_p must be between 0.01 and 1.0, got 3"),
    ("generate", "models:x", STORY, "compare must be one of adapter, steering, model:<id>, setting:<name>=<value>"),
    ("poem", "adapter", STORY, "task must be one of generate, chat, translate, summarize, got 'poem'"),
    ("generate", "steering", STORY, "comparing the steering needs a steering to switch on"),
    ("generate", "setting:top_k=5", {"prompt": "Hi", "warmth": 1}, "/generate takes no parameter 'warmth'"),
    ("generate", "setting:top_k=5", {"seed": 1}, "prompt is missing: /generate needs it"),
    ("generate", "setting:top_k=5", {"prompt": "  "}, "prompt is empty"),
])
def test_a_comparison_the_app_does_not_take_is_an_error_naming_the_field(client, task, compare_, values, said):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as refused:
        client.predict(task=task, compare=compare_, values=values, api_name="/compare")
    assert said in str(refused.value)


def test_studio_compare_takes_compare_in_its_body_and_a_page_in_front_passes_it_on(host, models):
    """POST /studio/compare/{api_name}: the task's values with compare, the rest its defaults; a
    RemoteHost (app.py --backend) sends a comparison's request there as it is."""
    from fastapi.testclient import TestClient

    from serve.backend import RemoteHost
    from serve.comparing import Comparison
    from serve.replica import replica_app

    http = TestClient(replica_app(host, "replica-1"))
    body = {**STORY, "compare": f"model:{models[1]}"}
    lines = [json.loads(line) for line in http.post("/studio/compare/generate", json=body).text.splitlines()]
    final = lines[-1]
    assert final["outcome"]["kind"] == "done" and final["texts"][0] == final["texts"][1]
    comparison = Comparison.from_json(final["comparison"])
    assert comparison.same and comparison.axis == body["compare"]
    refused = [json.loads(line) for line in http.post("/studio/compare/generate",
                                                      json={**STORY, "compare": "setting:warmth=1"}).text.splitlines()]
    assert refused[-1]["outcome"]["message"]["key"] == "compare_setting"

    remote = object.__new__(RemoteHost)  # a RemoteHost whose HTTP client is the replica's app in-process
    remote.url, remote.http = "http://testserver", http
    remote.queue = RunQueue()  # the page's own, which its runs take their turn in
    *_, (texts, outcome, from_replica) = remote.run_compare(APIS["generate"], {**STORY, "compare": "setting:top_k=3"})
    *_, (here, _, local) = host.run_compare(APIS["generate"], {**STORY, "compare": "setting:top_k=3"})
    assert outcome.ran and texts == here and from_replica.entries == local.entries
    *_, (_, outcome, _) = remote.run_compare(APIS["generate"], {"compare": "adapter"})
    assert outcome.message.key == "missing_parameter"

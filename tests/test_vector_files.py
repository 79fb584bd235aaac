"""Steering vectors as files on the page's side (serve/vectors.py): the vector a request's steering
makes, exported as a llama.cpp control vector and as safetensors, and imported back to steer a run
as the typed lines did; files that are no vector, or do not fit the model, refused with keyed
messages; a page in front of replicas does the same through /studio/steering."""
from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from serve.messages import Message, english, render
from serve.vectors import MAX_FILE_BYTES, SteeringVector, read_vector, write_vector_files

from .conftest import refused

POSITIVE = "She was very happy and loved to play.\nThe day was fun and bright."
NEGATIVE = "She was very sad and cried a lot.\nThe day was bad and dark."
STEER = dict(steer_positive=POSITIVE, steer_negative=NEGATIVE, steer_layer=2, steer_strength=3.5)


@pytest.fixture(scope="module")
def host(app_models):
    from serve.model_host import ModelHost

    return ModelHost(app_models[:1], device="cpu")  # 2 blocks, 64 wide


def run(host, **values):
    """(text, outcome) of a /generate run on `host` with these values over the API's defaults."""
    from serve.apis import APIS

    api = APIS["generate"]
    values = {**{p.name: p.default for p in api.signature.parameters.values()}, "prompt": "Once upon a time",
              "max_new_tokens": 16, "seed": 7, **values}
    *_, (text, outcome, _, _) = host.run(api, values)
    return text, outcome


def exported(host, tmp_path, **steer):
    vector = host.steering_vector({**STEER, **steer})
    return write_vector_files(vector, tmp_path / vector.digest[:16])


def test_export_then_import_steers_as_the_typed_lines_did(host, tmp_path):
    typed, typed_outcome = run(host, **STEER)
    assert typed != run(host)[0]  # the steering does change the text
    (gguf_path, safetensors_path), why_not = exported(host, tmp_path)
    assert why_not is None and gguf_path.suffix == ".gguf" and safetensors_path.suffix == ".safetensors"
    config = host.current.config
    control, saved = read_vector(gguf_path, config), read_vector(safetensors_path, config)
    # a control vector holds strength * v, as llama.cpp adds it: its strength is 1; safetensors keeps v and both
    assert (control.layer, control.strength, control.positive) == (2, 1.0, [])
    assert (saved.layer, saved.strength, saved.positive, saved.model) == (2, 3.5, POSITIVE.splitlines(),
                                                                          host.current.name)
    for file in (control, saved):
        text, outcome = run(host, steer_file=file.record, steer_layer=file.layer, steer_strength=file.strength,
                            steer_positive="\n".join(file.positive), steer_negative="\n".join(file.negative))
        assert text == typed
        # the status line names the file by its name and hash, and the record reproduces the run
        line = english(outcome.steering)
        assert line.startswith(f"steered at layer 2, strength {file.strength:g} by {file.name} "
                               f"(sha256 {file.sha256[:12]}): vector norm ")
        assert outcome.steering.field("sha256") == file.sha256
        assert outcome.steering.field("norm") == pytest.approx(typed_outcome.steering.field("norm") * 3.5
                                                               if file is control else
                                                               typed_outcome.steering.field("norm"))
        from serve.apis import APIS
        from serve.outcome import Outcome
        from serve.running import asked_again

        assert Outcome.from_json(json.loads(json.dumps(outcome.as_json()))) == outcome
        again_text, again = run(host, **asked_again(outcome, APIS["generate"].task))
        assert again_text == typed and again.reproduces(outcome)
    # strength 0 with a file: the run without steering, as with lines
    assert run(host, steer_file=control.record, steer_strength=0)[0] == run(host)[0]


def test_a_layer_llama_cpp_cannot_steer_gets_safetensors_only_and_says_why(host, tmp_path):
    paths, why_not = exported(host, tmp_path, steer_layer=1)
    assert [path.suffix for path in paths] == [".safetensors"]
    assert why_not == Message.keyed("steer_no_gguf", layer=1, first=2, n_layer=2)
    assert english(why_not) == ("no llama.cpp control vector (GGUF) for layer 1: llama.cpp steers after blocks 2 to "
                                "2 only; the safetensors file keeps it")
    assert read_vector(paths[0], host.current.config).layer == 1


def test_nothing_to_export_is_refused(host):
    with refused("steer_nothing"):
        host.steering_vector({**STEER, "steer_strength": 0})
    with refused("steer_pairs"):
        host.steering_vector({**STEER, "steer_negative": "one"})


def a_gguf_model(path):
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def a_vector(host, **changes) -> SteeringVector:
    config = host.current.config
    torch.manual_seed(0)
    vector = SteeringVector(torch.randn(config.n_embd).tolist(), 2, 1.0, [], [], "elsewhere", config.n_layer)
    return replace(vector, **changes)


def an_older_file(folder, vector: SteeringVector):
    """A safetensors vector as this app saved them before they named their model's blocks."""
    from engine.steering_files import save_steering

    folder.mkdir(exist_ok=True)
    save_steering(folder / "older.safetensors", vector.steering, [], [], vector.model)


@pytest.mark.parametrize("make,key,fields", [
    (lambda path, host: path.with_suffix(".safetensors").write_bytes(b"\x00" * 100), "steer_not_a_vector", {}),
    (lambda path, host: path.with_suffix(".gguf").write_bytes(b'{"persona": "not a vector"}'), "steer_not_a_vector",
     {}),
    (lambda path, host: path.with_suffix(".gguf").write_bytes(b"GGUF" + b"\xff" * 60), "steer_not_a_vector", {}),
    (lambda path, host: a_gguf_model(path.with_suffix(".gguf")), "steer_not_a_vector", {}),
    (lambda path, host: write_vector_files(a_vector(host, vector=[0.5] * 32), path), "steer_vector_width",
     dict(width=32, n_embd=64)),
    (lambda path, host: write_vector_files(a_vector(host, n_layer=6), path), "steer_vector_layers",
     dict(layers=6, n_layer=2)),
    (lambda path, host: an_older_file(path, a_vector(host, layer=5)), "steer_vector_layer", dict(layer=5, n_layer=2)),
], ids=["noise", "json", "broken-gguf", "a-model", "width", "layer-count", "layer"])
def test_a_file_that_is_no_vector_or_does_not_fit_is_refused_saying_why(host, tmp_path, make, key, fields):
    folder = tmp_path / "made"
    folder.mkdir()
    make(folder / "vector", host)
    path = sorted(made for made in folder.rglob("*") if made.is_file())[0]
    with refused(key, file=path.name, **fields) as caught:
        read_vector(path, host.current.config)
    assert path.name in english(caught.value.message) and render(caught.value.message, "zh")


def test_a_control_vector_of_several_layers_and_a_file_too_big_are_refused(host, tmp_path):
    config = host.current.config
    path = tmp_path / "two.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    for k in (1, 2):  # a layer more than the model has, and both steered
        writer.add_tensor(f"direction.{k}", np.ones(config.n_embd, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with refused("steer_file_layers", file="two.gguf", count=2):
        read_vector(path, config)
    big = tmp_path / "big.safetensors"
    big.write_bytes(b"\x00" * (MAX_FILE_BYTES + 1))
    with refused("steer_file_size", file="big.safetensors", size=MAX_FILE_BYTES + 1):
        read_vector(big, config)
    with refused("unreadable_file"):
        read_vector(tmp_path / "gone.gguf", config)


@pytest.mark.parametrize("record,key", [
    ({"name": "v.gguf", "sha256": "ab", "vector": [1.0] * 32}, "steer_vector_width"),  # another model's
    ({"name": "v.gguf", "sha256": "ab", "vector": [float("nan")] * 64}, "steer_file_record"),
    ({"name": "v.gguf", "vector": [1.0] * 64}, "steer_file_record"),
    ("v.gguf", "steer_file_record"),
])
def test_a_run_refuses_a_file_record_that_does_not_fit(host, record, key):
    _, outcome = run(host, **STEER, steer_file=record)
    assert not outcome.ran and outcome.message.key == key


def test_studio_steering_and_a_remote_host_in_front_of_it(host, tmp_path):
    """A page in front of replicas gets the vector from /studio/steering, and writes the same files;
    a run it stops before the replica answers names its steering, without the norms measured there."""
    from fastapi.testclient import TestClient

    from serve.apis import APIS
    from serve.backend import RemoteHost, stopped
    from serve.outcome import english_status
    from serve.replica import replica_app

    client = TestClient(replica_app(host, "replica-1"))
    remote = object.__new__(RemoteHost)  # a RemoteHost whose HTTP client is the replica's app in-process
    remote.url, remote.http = "http://testserver", client
    assert remote.steering_vector(STEER) == host.steering_vector(STEER)
    with refused("steer_nothing"):
        remote.steering_vector({**STEER, "steer_strength": 0})
    api = APIS["generate"]
    values = {**{p.name: p.default for p in api.signature.parameters.values()}, "prompt": "Hi", "seed": 3}
    config = host.current.config
    line = english_status(stopped(api, {**values, **STEER}, None, config))
    assert "stopped: Stop pressed · steered at layer 2, strength 3.5: 2 pairs · " in line
    file = {"name": "happy.gguf", "sha256": "0123456789abcdef" * 4, "vector": [0.25] * config.n_embd}
    line = english_status(stopped(api, {**values, **STEER, "steer_file": file}, None, config))
    assert "steered at layer 2, strength 3.5 by happy.gguf (sha256 0123456789ab)" in line
    assert "steered" not in english_status(stopped(api, values, None, config))

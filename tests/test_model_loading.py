"""Loading a model while the app serves (serve/model_host.py, ModelHost.load and unload): a hub id or
a local directory joins the models and is served, with its steps reported; what cannot be had (not
a checkpoint, too big for the memory free) is refused and the model served stays; an unloaded model
leaves the list and its memory is freed; and none of it where loading is not allowed."""
from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from serve import model_host
from serve.apis import GENERATE_API
from serve.model_host import LOAD_STEPS, ModelHost
from serve.outcome import DONE
from serve.running import setting_params

from .conftest import make_hf_checkpoint, refused


@pytest.fixture(scope="module")
def second_checkpoint(tmp_path_factory) -> str:
    return str(make_hf_checkpoint(tmp_path_factory.mktemp("second"), seed=2, n_positions=64, n_embd=32, n_layer=1,
                                  n_head=2))


@pytest.fixture
def host(tiny_checkpoint) -> ModelHost:
    return ModelHost([str(tiny_checkpoint)], device="cpu", allow_load=True)


def test_a_local_checkpoint_loads_joins_the_models_and_reports_its_steps(host, tiny_checkpoint, second_checkpoint):
    steps = []
    loaded = host.load(f"  {second_checkpoint} ", steps.append)  # as typed, with spaces around it
    assert steps == list(LOAD_STEPS)
    assert host.current is loaded and loaded.name == second_checkpoint and loaded.context == 64
    assert host.names == (str(tiny_checkpoint), second_checkpoint)
    host.load(second_checkpoint)  # again: served already, listed once
    assert host.current is loaded and host.names == (str(tiny_checkpoint), second_checkpoint)


def test_unloading_the_served_model_serves_the_first_left_and_frees_its_memory(host, tiny_checkpoint,
                                                                              adapter_checkpoint):
    """Freed at once, after a run and a look inside with an adapter (which leave reference cycles),
    with the collector's own passes off."""
    unloaded = weakref.ref(host.load(str(adapter_checkpoint)).model)
    values = {param.name: param.default for param in setting_params(GENERATE_API.task)}
    assert list(host.run(GENERATE_API, {**values, "prompt": "Hello", "max_new_tokens": 4}))[-1][1].kind == DONE
    host.look_inside("Hello there", 1, 1, "summarize")
    gc.disable()
    try:
        served = host.unload(str(adapter_checkpoint))
        assert unloaded() is None  # nothing holds its weights any more
    finally:
        gc.enable()
    assert host.current is served and served.name == str(tiny_checkpoint)
    assert host.names == (str(tiny_checkpoint),)


def test_unloading_a_model_not_served_leaves_the_served_one_alone(host, tiny_checkpoint, second_checkpoint):
    host.load(second_checkpoint)
    served = host.switch(str(tiny_checkpoint))
    assert host.unload(second_checkpoint) is served and host.current is served
    assert host.names == (str(tiny_checkpoint),)
    with refused("not_a_model"):
        host.switch(second_checkpoint)  # no longer offered
    with refused("last_model", name=str(tiny_checkpoint)):
        host.unload(str(tiny_checkpoint))  # there would be nothing to serve


@pytest.mark.parametrize("what", ["a file", "a directory with no checkpoint", "a path that does not exist"])
def test_what_is_not_a_checkpoint_is_refused_and_the_served_model_stays(host, tmp_path, what):
    path = {"a file": tmp_path / "notes.txt", "a directory with no checkpoint": tmp_path,
            "a path that does not exist": tmp_path / "missing"}[what]
    (tmp_path / "notes.txt").write_text("not a model")
    served, names = host.current, host.names
    with refused("load_failed", name=str(path)):
        host.load(str(path))
    assert host.current is served and host.names == names and host.loading is None
    with refused("no_model_named"):
        host.load("   ")


def test_a_model_too_big_for_the_memory_free_is_refused_before_its_weights_are_read(host, second_checkpoint,
                                                                                   monkeypatch):
    needed = 4 * ModelHost([second_checkpoint], device="cpu").current.model.num_parameters()
    monkeypatch.setattr(model_host.psutil, "virtual_memory", lambda: SimpleNamespace(available=needed - 1))
    served, steps = host.current, []
    with refused("not_enough_memory", name=second_checkpoint, needed=needed / 2**30) as caught:
        host.load(second_checkpoint, steps.append)
    assert caught.value.message.field("available") == (needed - 1) / 2**30
    assert steps == ["download"]  # refused before "load"
    assert host.current is served and second_checkpoint not in host.names
    monkeypatch.setattr(model_host.psutil, "virtual_memory", lambda: SimpleNamespace(available=needed))
    assert host.load(second_checkpoint).name == second_checkpoint  # where it fits, it loads


def test_a_hub_model_too_big_is_refused_from_its_config_before_its_weights_are_fetched(host, second_checkpoint,
                                                                                      tmp_path, monkeypatch):
    """Only the config of `someone/huge` is in the local cache, offline: the memory check reads it and
    refuses, where fetching the weights first would have failed on the missing weights (or, online,
    downloaded gigabytes it could not load)."""
    import huggingface_hub.constants as constants

    repo = tmp_path / "cache" / "models--someone--huge"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    shutil.copy(Path(second_checkpoint) / "config.json", repo / "snapshots" / ("0" * 40) / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_host.psutil, "virtual_memory", lambda: SimpleNamespace(available=1))
    served = host.current
    with refused("not_enough_memory", name="someone/huge"):
        host.load("someone/huge")
    assert host.current is served and "someone/huge" not in host.names


def test_without_allow_load_nothing_is_loaded_nor_unloaded(tiny_checkpoint, second_checkpoint):
    host = ModelHost([str(tiny_checkpoint), second_checkpoint], device="cpu")  # off unless asked
    served = host.current
    for change in (lambda: host.load(second_checkpoint), lambda: host.unload(second_checkpoint)):
        with refused("load_not_allowed", flag="--allow-load"):
            change()
    assert host.current is served and host.names == (str(tiny_checkpoint), second_checkpoint)

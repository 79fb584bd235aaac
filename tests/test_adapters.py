"""Per-task LoRA adapters: PEFT files, switched per request, exact base logits when off."""
from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch
from peft import PeftModel
from transformers import GPT2LMHeadModel

from model import load_pretrained
from model.adapters import active_adapter, adapter_names, load_adapter

from .conftest import make_checkpoint_with_adapters


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint_with_adapters(tmp_path_factory.mktemp("base"), n_positions=64, n_embd=48, n_layer=2,
                                         n_head=3)


IDS = torch.randint(0, 50257, (2, 12), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def logits(model, adapter=None):
    with active_adapter(adapter):
        return model(IDS)


@torch.no_grad()
def test_off_is_exactly_base_on_changes_switching_is_stable(checkpoint, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare, ignore=shutil.ignore_patterns("adapters"))
    base, _ = load_pretrained(bare)
    model, _ = load_pretrained(checkpoint)
    assert adapter_names(base) == [] and adapter_names(model) == ["summarize", "translate"]
    off = logits(model)
    assert torch.equal(off, logits(base))
    summarize, translate = logits(model, "summarize"), logits(model, "translate")
    assert not torch.allclose(summarize, off, atol=1e-3) and not torch.allclose(translate, summarize, atol=1e-3)
    assert torch.equal(logits(model, "summarize"), summarize)  # switching back and forth changes nothing
    assert torch.equal(logits(model), off)


@torch.no_grad()
def test_peft_adapter_from_transformers_gives_the_same_logits(checkpoint):
    ours, _ = load_pretrained(checkpoint)
    for name in ("summarize", "translate"):
        reference = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(checkpoint),
                                              checkpoint / "adapters" / name).eval()
        assert (logits(ours, name) - reference(IDS).logits).abs().max() < 1e-4


@torch.no_grad()
def test_adapter_choice_is_per_thread(checkpoint):
    """Two requests at once, one with the adapter and one without, each get their own logits."""
    model, _ = load_pretrained(checkpoint)
    expected = {None: logits(model), "summarize": logits(model, "summarize")}
    results, barrier = {}, threading.Barrier(2)

    def request(name):
        with torch.no_grad(), active_adapter(name):  # grad mode is per thread too: as the expected logits
            barrier.wait()  # both adapters chosen before either runs
            results[name] = [model(IDS) for _ in range(3)]

    threads = [threading.Thread(target=request, args=(name,)) for name in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, outputs in results.items():
        assert all(torch.equal(out, expected[name]) for out in outputs)


def test_bad_adapter_files_are_named(checkpoint, tmp_path):
    model, _ = load_pretrained(checkpoint)
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint / "adapters" / "summarize", broken)
    (broken / "adapter_model.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match="adapter_model.safetensors: cannot read adapter weights"):
        load_adapter(model, broken, "broken")
    with pytest.raises(ValueError, match="this model has no 'dialogue' adapter"):
        from engine.generate import SamplingParams, decode_tokens
        next(decode_tokens(model, [[1, 2]], SamplingParams(), [0], adapter="dialogue"))


def test_the_adapters_the_evaluation_found_better_start_switched_on(checkpoint, tmp_path):
    from tasks import TASKS
    from train.eval import adapters_that_help
    from serve.model_host import ModelHost
    from ui.tab import adapter_props

    def headline(task, metric, test_set, base, adapter):
        return {"task": task, "metric": metric, "test_set": test_set, "n": 1, "base": base, "adapter": adapter}

    rows = [headline("translate", "chrF", "Tatoeba all directions", 20.0, 31.0),
            headline("translate", "chrF", "Tatoeba English->French", 40.0, 10.0),  # not the headline row
            headline("summarize", "ROUGE-L F1", "Aesop fable -> lesson", 12.0, 9.0),
            headline("dialogue", "response loss (bits per byte, lower is better)", "held-out responses", 2.0, 1.5)]
    assert adapters_that_help(rows) == ["translate", "dialogue"]  # higher chrF, lower loss; not a worse ROUGE
    # a mean over seeds must win by more than two standard errors of the difference (2 x hypot(0.6, 0.8) = 2)
    rouge = {**rows[2], "base": 10.0, "adapter": 11.9, "standard_error": {"base": 0.6, "adapter": 0.8}}
    assert adapters_that_help([rouge]) == []
    assert adapters_that_help([{**rouge, "adapter": 12.1}]) == ["summarize"]
    # scores on the same items (a paired bootstrap): twice the standard error of the difference
    chrf = {**rows[0], "base": 40.0, "adapter": 41.0, "standard_error": {"base": 2.0, "adapter": 2.0}}
    assert adapters_that_help([{**chrf, "difference_error": 0.4}]) == ["translate"]
    assert adapters_that_help([{**chrf, "difference_error": 0.6}]) == []
    assert adapters_that_help([chrf]) == []  # unpaired, 2 x hypot(2, 2) = 5.7 would hide it

    with_defaults = tmp_path / "model"
    shutil.copytree(checkpoint, with_defaults)
    (with_defaults / "adapters" / "on_by_default.json").write_text(json.dumps({"on": ["translate", "dialogue"]}))
    loaded = ModelHost([str(with_defaults)]).current
    assert loaded.adapters_on == ["translate"]  # dialogue has no adapter in this checkpoint
    assert adapter_props(TASKS["translate"], loaded)["value"] is True
    assert adapter_props(TASKS["summarize"], loaded)["value"] is False
    # an adapter that starts off says so, and why, so a user knows it is meant
    assert adapter_props(TASKS["summarize"], loaded)["info"].key == "adapter_info_off"
    assert adapter_props(TASKS["translate"], loaded)["info"].key == "adapter_info"
    assert ModelHost([str(checkpoint)]).current.adapters_on == []  # no file: every adapter starts off

    (with_defaults / "adapters" / "on_by_default.json").write_text('["translate"]')
    with pytest.raises(ValueError, match="on_by_default.json"):
        load_pretrained(with_defaults)

"""The model the app ships: it loads offline with its adapters, fits the size budget, and the
samples in its card are what the shipped files write."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from model import load_pretrained
from model.adapters import adapter_names
from model.checkpoint import BUNDLED_DIR
from tasks import TASKS, TaskDone, run_task

from .conftest import serving


@pytest.fixture(scope="module")
def bundled():
    return serving(load_pretrained())  # as the app serves it


def test_loads_offline_with_an_adapter_per_task(bundled, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_pretrained()
    assert tokenizer.name == "sentencepiece"
    assert adapter_names(model) == sorted(t.adapter for t in TASKS.values() if t.adapter)


def test_assets_fit_the_budget():
    total = sum(f.stat().st_size for f in BUNDLED_DIR.rglob("*") if f.is_file())
    assert total < 60 * 2**20


def test_card_samples_are_what_the_shipped_files_write(bundled):
    model, tokenizer = bundled
    samples = json.loads((BUNDLED_DIR / "samples.json").read_text())
    card = (BUNDLED_DIR / "README.md").read_text()
    assert len(samples) >= 6
    for sample in samples:
        task = TASKS[sample["task"]]
        params = replace(task.defaults, seed=sample["seed"])
        done = next(e for e in run_task(task, model, tokenizer, task.inputs(**sample["inputs"]), params,
                                        sample["adapter"]) if isinstance(e, TaskDone))
        assert (done.prompt.text, done.text) == (sample["prompt"], sample["output"])
        assert f"```text\n{sample['output']}\n```" in card

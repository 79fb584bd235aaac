"""The pretraining command end to end on a tiny configuration: loss falls, checkpoints save,
resume and load."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from model import GPT2, GPT2Config, load_pretrained
from tasks import TASKS
from train.data import example_from_record, pretraining_documents
from train.corpus import pretrain_documents, tinystories_validation_text
from train.pretrain import (DEFAULT_MIX, TrainSettings, learning_rate, main, mixed_batches, rows_per_source, train)

pytestmark = pytest.mark.slow  # training runs
REPO = Path(__file__).resolve().parent.parent

TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
        "--warmup-steps", "5", "--lr", "3e-3", "--eval-every", "10", "--save-every", "10", "--device", "cpu"]


def test_pretraining_runs_saves_resumes_and_loads(tmp_path, pretraining_data):
    text = tmp_path / "stories.txt"
    text.write_text(tinystories_validation_text()[:60_000])
    out = tmp_path / "run"
    main(["--out", str(out), "--text", str(text), "--max-steps", "20", *TINY])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [10, 20]
    assert log[-1]["val_loss"] < log[0]["val_loss"] < 9.0  # ln(8192) = 9.01 is the loss of a uniform guess
    model, tokenizer = load_pretrained(out)
    assert tokenizer.name == "sentencepiece" and model.config.n_positions == 32

    main(["--out", str(out), "--text", str(text), "--max-steps", "30", "--resume", *TINY])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [10, 20, 30]
    resumed, _ = load_pretrained(out)
    assert not torch.equal(resumed.transformer.wte.weight, model.transformer.wte.weight)
    state = torch.load(out / "train_state.pt", weights_only=True)
    assert state["step"] == 30


def test_learning_rate_warms_up_then_decays():
    s = TrainSettings(max_steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [learning_rate(step, s) for step in range(100)]
    assert lrs[0] == 0.1 and lrs[9] == 1.0
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and abs(lrs[-1] - 0.1) < 1e-3


def log_of(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_a_resumed_run_has_the_loss_curve_of_an_uninterrupted_one(tmp_path, pretraining_data):
    text = tmp_path / "stories.txt"
    text.write_text(tinystories_validation_text()[:60_000])
    flags = ["--text", str(text), "--max-steps", "30", "--eval-every", "5", *TINY[:-6], "--device", "cpu",
             "--precision", "fp32"]
    main(["--out", str(tmp_path / "straight"), *flags])
    main(["--out", str(tmp_path / "halves"), *flags, "--stop-after", "15"])
    assert [r["step"] for r in log_of(tmp_path / "halves")] == [5, 10, 15]
    main(["--out", str(tmp_path / "halves"), *flags, "--resume"])
    straight, halves = log_of(tmp_path / "straight"), log_of(tmp_path / "halves")
    assert [r["step"] for r in halves] == [r["step"] for r in straight] == [5, 10, 15, 20, 25, 30]
    for a, b in zip(straight, halves):
        assert a["lr"] == b["lr"]
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["val_loss"] - b["val_loss"]) < 1e-5, (a, b)
    assert straight[-1]["val_loss"] < straight[0]["val_loss"]


def tiny_losses(steps: int, **settings) -> list[float]:
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    data = (torch.arange(4000, dtype=torch.int32) * 7) % 61  # a pattern the model can learn in a few steps
    next_batch = mixed_batches({"data": data}, {"data": 1.0}, 8, 32, seed=0, device="cpu")
    history = train(model, next_batch, TrainSettings(max_steps=steps, warmup_steps=2, lr=1e-2, **settings),
                    progress=False)
    return [r["loss"] for r in history]


def test_bf16_and_compiled_steps_give_the_reference_loss():
    reference = tiny_losses(12)
    assert reference[-1] < reference[0] - 0.05  # the runs learn, so agreeing means something
    bf16 = tiny_losses(12, bf16=True)
    compiled = tiny_losses(12, compile=True)
    for step, (ref, low, comp) in enumerate(zip(reference, bf16, compiled)):
        assert abs(low - ref) < 0.01 * ref, (step, ref, low)
        assert abs(comp - ref) < 1e-4 * ref, (step, ref, comp)
    assert bf16 != reference  # bf16 autocast did change the arithmetic


def test_rows_follow_the_mix_whole_parts_always_and_the_rest_on_average():
    weights = {"a": 0.33, "b": 0.32, "c": 0.22, "d": 0.10, "e": 0.03}
    generator = torch.Generator().manual_seed(0)
    totals = dict.fromkeys(weights, 0)
    for _ in range(2000):
        rows = rows_per_source(8, weights, generator)
        assert sum(rows.values()) == 8 and rows["a"] >= 2 and rows["b"] >= 2 and rows["c"] >= 1
        for name, n in rows.items():
            totals[name] += n
    for name, weight in weights.items():
        assert abs(totals[name] / 16000 - weight) < 0.01, (name, totals[name] / 16000)
    assert rows_per_source(16, {"x": 0.5, "y": 0.5}, generator) == {"x": 8, "y": 8}


def fingerprint(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def test_the_pretraining_mix_never_holds_a_test_item(task_splits):
    documents = pretraining_documents(task_splits)
    assert set(documents) | {"tinystories", "gutenberg"} == set(DEFAULT_MIX)
    sentences, examples = set(), set()
    for line in (line for doc in documents["translation"] for line in doc.split("\n")):
        source, target = line.split(" = ")
        sentences |= {fingerprint(source), fingerprint(target)}
    for doc in documents["dialogue"] + documents["summaries"]:
        examples.add(fingerprint(doc))
        sentences |= {fingerprint(part) for part in doc.split("\n")}
    held_out = task_splits["translate"]
    for split in ("test", "val"):
        for r in held_out[split]:
            assert fingerprint(r["text"]) not in sentences and fingerprint(r["translation"]) not in sentences, r
    for task, splits in (("dialogue", task_splits["dialogue"]), ("summarize", task_splits["summarize"])):
        for r in splits["test"] + splits["val"] + splits.get("derived-test", []):
            assert fingerprint("".join(TASKS[task].format_example(*example_from_record(task, r)))) not in examples, r
    aesop_tests = {fingerprint(r["article"]) for r in task_splits["summarize"]["test"]}
    assert aesop_tests and not aesop_tests & sentences
    prose = " ".join(" ".join(pretrain_documents("train")).split())  # nor is a test fable in the books or stories
    assert all(" ".join(r["article"].split()[:12]) not in prose for r in task_splits["summarize"]["test"])


def test_the_tokenizer_reads_no_held_out_sentence(task_splits):
    """scripts/train_tokenizer.py's task text is the training splits alone."""
    spec = importlib.util.spec_from_file_location("train_tokenizer", REPO / "scripts" / "train_tokenizer.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    lines = {fingerprint(part) for document in script.task_documents(task_splits)
             for line in document.split("\n") for part in line.split(" = ")}
    held_out = [r for split in ("val", "test", "far-val", "far-test") for r in task_splits["translate"][split]]
    assert len(lines) > 100_000 and held_out
    assert not any(fingerprint(r["text"]) in lines or fingerprint(r["translation"]) in lines for r in held_out)


def test_init_continues_from_a_checkpoint_with_a_fresh_schedule_and_counts_every_token(tmp_path, pretraining_data):
    text = tmp_path / "stories.txt"
    text.write_text(tinystories_validation_text()[:60_000])
    main(["--out", str(tmp_path / "first"), "--text", str(text), "--max-steps", "20", *TINY])
    no_size = [flag for i, flag in enumerate(TINY) if "--block-size" not in TINY[max(0, i - 1):i + 1]]
    main(["--out", str(tmp_path / "second"), "--init", str(tmp_path / "first"), "--text", str(text),
          "--max-steps", "10", *no_size])
    first, second = log_of(tmp_path / "first"), log_of(tmp_path / "second")
    assert second[0]["step"] == 10 and second[0]["val_loss"] < first[0]["val_loss"]  # it went on from first
    record = json.loads((tmp_path / "second" / "training.json").read_text())
    assert [run["steps"] for run in record["runs"]] == [20, 10]
    assert record["tokens_seen"] == (20 + 10) * 8 * 32
    model, _ = load_pretrained(tmp_path / "second")
    assert model.config.n_positions == 32  # the block size came from the checkpoint

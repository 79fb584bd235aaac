"""The pretraining command end to end on a tiny configuration: loss falls, checkpoints save,
resume and load."""
from __future__ import annotations

import json

import torch

from model import load_pretrained
from train.corpus import tinystories_validation_text
from train.pretrain import TrainSettings, learning_rate, main

TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
        "--warmup-steps", "5", "--lr", "3e-3", "--eval-every", "10", "--save-every", "10", "--device", "cpu"]


def test_pretraining_runs_saves_resumes_and_loads(tmp_path):
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

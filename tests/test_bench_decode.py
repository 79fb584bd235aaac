"""The decode benchmark (bench/decode.py) runs end to end and writes the JSON keys issue 5 names.
How fast anything is stays the benchmark's to say (docs/performance.md), never a test's."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from bench.decode import KEYS, table

from .conftest import REPO


def test_the_decode_benchmark_prints_its_table_and_writes_the_required_keys(tmp_path):
    out = tmp_path / "decode.json"
    done = subprocess.run([sys.executable, "-m", "bench.decode", "--new-tokens", "2", "--reps", "1", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    numbers = json.loads(out.read_text())
    assert list(numbers)[:len(KEYS)] == list(KEYS)  # the required keys first
    assert all(numbers[key] > 0 for key in KEYS)  # every one measured
    assert 0.99 < numbers["bundled_int8_ppl_ratio"] < 1.01  # the shipped model, int8 against fp32
    assert numbers["load_ours_s"] > 0 and numbers["load_hf_s"] > 0
    for row in ("| decode, batch 1, fp32 (tokens/s) |", "| roofline, fp32 / int8 (tokens/s) |",
                "| one batch-1 decode step (ms) |", "| load a checkpoint of the 124M shape (s) |",
                "| bundled model, fp32: scheduler, 1 / 8 clients"):
        assert row in done.stdout
    # A run in bf16 (on a GPU, say) labels its GPT-2 small rows bf16; the bundled model stays fp32.
    bf16 = table(numbers, torch.device("cpu"), torch.bfloat16, 2, 1)
    assert "| decode, batch 1, bf16 (tokens/s) |" in bf16 and "| roofline, bf16 / int8 (tokens/s) |" in bf16
    assert "| decode, batch 1, fp32" not in bf16 and "| bundled model, fp32: scheduler" in bf16

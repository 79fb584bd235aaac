"""The benchmarks' pieces: the kernels switched off for the side-by-side, the scheduler's clients,
the decode table's rows, and the start-up benchmark end to end. How fast anything is stays the
benchmarks' to say (docs/performance.md), never a test's."""
from __future__ import annotations

import pytest
import torch

from bench.decode import BUNDLED_KEYS, CLIENTS, FRACTIONS, KEYS, scheduler_clients, table, without_kernels
from engine import kernels
from model import load_pretrained

from .conftest import serving

pytestmark = pytest.mark.slow  # fresh clones and benchmarks


def test_without_kernels_runs_on_pytorch_with_int8_weights_row_by_row_and_puts_both_back_after():
    """As a machine without the kernels runs: PyTorch's path, the int8 weights row by row (the
    kernels' packing is theirs); after, the kernels and the very packed weights again."""
    from engine.quantize import Int8Linear

    layer = kernels.install(torch.nn.Sequential(Int8Linear(torch.randn(32, 128), None)))[0]
    packed_at = layer.weight.data_ptr()
    seen = []
    run = without_kernels(lambda: seen.append((kernels.decode_kernels(), layer.packed, layer.rows().clone())) or 1.0,
                          layer)
    assert run() == 1.0 and seen[0][:2] == (None, False) and torch.equal(seen[0][2], layer.rows())
    assert (kernels.decode_kernels() is None) == (kernels.unavailable_reason() is not None)
    assert layer.packed == (kernels.unavailable_reason() is None) and layer.weight.data_ptr() == packed_at


def test_scheduler_clients_stream_together_and_count_every_token(tiny_checkpoint):
    model, tokenizer = serving(load_pretrained(tiny_checkpoint))
    assert scheduler_clients(model, tokenizer, CLIENTS, 5) > 0


def test_the_decode_table_has_a_row_for_each_figure_and_the_kernels_side_by_side():
    numbers = {key: 1.0 for key in KEYS + BUNDLED_KEYS}
    numbers.update({key: 1.0 for key in (
        "hf_sdpa_tok_s", "hf_eager_tok_s", "prefill512_hf_sdpa_ms", "prefill512_hf_eager_ms", "bandwidth_gb_s",
        "bandwidth_low_gb_s", "bandwidth_high_gb_s", "roofline_int8_tok_s", "weights_sum_gb_s", "products_gb_s",
        "products_ms", "decode_step_ms", "load_ours_s", "load_hf_s", "ours_fp32_nokernels_tok_s",
        "ours_int8_nokernels_tok_s", "ours_batch8_nokernels_tok_s", "ours_int8_batch8_nokernels_tok_s",
        "bandwidth_int8_gb_s", "bandwidth_int8_low_gb_s", "bandwidth_int8_high_gb_s", "int8_logits_error",
        *(f"int8_{key}" for key in ("weights_sum_gb_s", "products_gb_s", "products_ms", "decode_step_ms")),
        *(f"{name}_roofline_fraction" for name in FRACTIONS))})
    numbers["int8_dot"] = "AVX512-VNNI"
    text = table(numbers, torch.device("cpu"), torch.float32, 2, 1)
    for row in ("| decode, batch 1, fp32 (tokens/s) |", "| roofline at batch 1, fp32 / int8 (tokens/s) |",
                "| the decode kernels' gain: batch 1 fp32", "| the decode kernels' gain: batch 1 int8",
                "| the decode kernels' gain: batch 8 fp32", "| the decode kernels' gain: bundled fp32, 8 clients",
                "| bundled model, fp32: scheduler, 1 / 8 clients", "| the decode kernels' gain: batch 8 int8",
                "| decode as a fraction of its roofline |", "| int8 products: the integer dot products taken | AVX512-VNNI |"):
        assert row in text
    # A run in bf16 (on a GPU, say) labels its GPT-2 small rows bf16; the bundled model stays fp32.
    bf16 = table(numbers, torch.device("cpu"), torch.bfloat16, 2, 1)
    assert "| decode, batch 1, bf16 (tokens/s) |" in bf16 and "| roofline at batch 1, bf16 / int8 (tokens/s) |" in bf16
    assert "| decode, batch 1, fp32" not in bf16 and "| bundled model, fp32: scheduler" in bf16


def test_the_faults_bench_counts_each_ending_and_compares_first_text_around_each_kill():
    from bench import faults

    records = [faults.Record("v1", 5.0, 0.1, ending="completed", text_checked=True),
               faults.Record("v1", 25.0, 0.2, retries=1, ending="completed", text_checked=True, text_wrong=True),
               faults.Record("studio", 29.0, 0.3, ending="error event", detail="replica_lost"),
               faults.Record("v1", 31.0, 2.0, ending="silently cut"), faults.Record("v1", 45.0, None, ending="refused")]
    report = faults.summarize(records, [{"at_s": 30.0, "replica": "r", "replaced_after_s": 9.0}], 120)
    assert (report["requests"], report["completed"], report["retried"], report["error event"], report["refused"],
            report["silently cut"], report["checked"], report["wrong_text"]) == (5, 2, 1, 1, 1, 1, 2, 1)
    kill = report["kills"][0]  # the streams started in the 10 s before it, and in the 10 s after
    assert kill["before"]["streams"] == 2 and kill["before"]["max_ms"] == 300 and kill["after"]["p50_ms"] == 2000
    text = faults.table({**report, "clients": 16, "seconds": 120, "kill_every": 30, "replicas": 2,
                         "model": "bundled", "decode_path": "PyTorch"})
    assert "| 5 | 2 | 1 | 1 | 1 | 0 | 1 | 1 of 2 |" in text and "| 30.0 s | 9.0 s |" in text


def test_a_fresh_clone_answers_before_its_kernels_are_built(fresh_clone_startup):
    """bench.startup: a fresh clone with an empty build cache serves /generate on PyTorch's path
    while the kernels build in the background, and says when they are ready."""
    n = fresh_clone_startup.result()
    assert "16 generated tokens" in n["status"]
    if kernels.unavailable_reason() is None:
        assert n["kernels_ready_s"] is not None and n["kernels_ready_s"] > n["first_generate_s"]


def test_the_bandwidth_reads_as_many_bytes_as_asked_in_one_block_or_not():
    """The roofline's read covers the weights' bytes: from the model's own block where
    engine.kernels put the weights in one, from a tensor of its own where not (a model not
    prepared for serving), never fewer bytes than asked."""
    from bench.decode import floats_to_read, read_bandwidth, weight_block
    from engine import prepare_for_serving
    from model import GPT2, GPT2Config

    config = GPT2Config(vocab_size=500, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    plain, served = GPT2(config), prepare_for_serving(GPT2(config))
    weights = sum(p.numel() * 4 for p in served.parameters() if p.dim() == 2)
    assert weight_block(plain) is None
    block = weight_block(served)
    assert block is None or block.numel() >= weights  # (no huge pages from Linux: the weights stay apart)
    for model in (plain, served):
        for nbytes in (1000, weights, 3 * weights):
            x = floats_to_read(model, nbytes)
            assert x.dtype == torch.float32 and x.numel() == nbytes // 4
        assert read_bandwidth(model, weights)() > 0
    if block is not None:  # the served model's own weights, no copy
        assert floats_to_read(served, weights).data_ptr() == block.data_ptr()

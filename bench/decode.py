"""Decode speed: ours against transformers, side by side in one process.

    python -m bench.decode [--json PATH] [--device cpu|cuda] [--dtype float32|bfloat16]
                           [--new-tokens N] [--reps N] [--bundled DIR]

GPT-2 in its 124M shape with random weights (no download) is built once and loaded into both our
GPT2 and transformers' GPT2LMHeadModel. The runs alternate (ours fp32 and int8 at batch 1 and 8,
transformers sdpa and eager, prefills) and each number is the median of --reps runs,
so a slow moment of the machine hits every variant alike. Decode speed is greedy, from a 32-token
prompt, prefill included, for ours and for `GPT2LMHeadModel.generate` alike.

Also measured: the read bandwidth, in every round like the rest, and from it each roofline (the
bandwidth / the weight bytes a token reads: at batch 1 every weight is read once per token; at
batch 8 once for 8 tokens), with each decode figure as a fraction of its own. The bandwidth is
read over as many bytes as each model's weights (fp32, int8), for the caches hold a different
share of each: on a CPU with a 300 MiB L3, the int8 weights of GPT-2 small (124 MB) stay in it
and the fp32 ones (497 MB) do not. Also: which integer dot products int8 takes
(engine/kernels.py, INT8_DOT), int8's logits against fp32's on the same prompt; peak
resident memory; the time to load a checkpoint of the 124M shape, ours against
`GPT2LMHeadModel.from_pretrained` (after the peak memory is taken: each load holds another copy
for a moment); and, on the
bundled model (assets/, when it has been trained), its load time, its int8 perplexity against
fp32, and 8 concurrent clients of the continuous-batching scheduler against one.

Each ratio the targets of issue 5 are judged on is also given round by round (both sides of it
measured seconds apart), as the median of the rounds' ratios: the machine's speed drifts during
a run (docs/performance.md).

Prints a Markdown table; --json writes the numbers (see KEYS).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import transformers

from bench import cpu_name
from model import GPT2, GPT2Config, load_pretrained
from model.checkpoint import BUNDLED_DIR, WEIGHT_FILES, to_our_layout
from engine import kernels, prepare_for_serving
from engine.cache import new_cache
from engine.generate import SamplingParams, decode_tokens, generate
from engine.quantize import Int8Linear, unpack
from engine.scheduler import Scheduler, in_thread_of_its_own

PROMPT_TOKENS, PREFILL_TOKENS, BATCH, CLIENTS = 32, 512, 8, 8
# What bundled_checks measures (None for each when the bundled model has not been trained).
BUNDLED_KEYS = ("bundled_load_s", "bundled_int8_ppl_ratio", "clients1_tok_s", "clients8_tok_s", "clients1_int8_tok_s",
                "clients8_int8_tok_s", "clients8_nokernels_tok_s", "clients8_per_round", "clients8_int8_per_round",
                "clients8_kernels_gain_per_round")
KEYS = ("ours_fp32_tok_s", "ours_int8_tok_s", "hf_sdpa_tok_s", "hf_eager_tok_s", "ours_batch8_tok_s",
        "ours_int8_batch8_tok_s", "prefill512_ours_ms", "prefill512_hf_ms", "ttft_ms", "peak_rss_mb",
        "roofline_fp32_tok_s", "roofline_int8_tok_s", "int8_dot")
# Each decode figure and the roofline it is a fraction of: (tokens/s key, roofline key, rows).
FRACTIONS = {"fp32": ("ours_fp32_tok_s", "roofline_fp32_tok_s", 1),
             "int8": ("ours_int8_tok_s", "roofline_int8_tok_s", 1),
             "batch8": ("ours_batch8_tok_s", "roofline_fp32_tok_s", BATCH),
             "int8_batch8": ("ours_int8_batch8_tok_s", "roofline_int8_tok_s", BATCH)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds(run: Callable[[], object], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def read_bandwidth(model: GPT2, nbytes: int) -> Callable[[], float]:
    """A measurement of the read bandwidth over `nbytes`, to take in each round: the bytes per
    second of summing that many bytes as floats, the best of 5 sums in a row (GB/s), as a decode
    step reads its weights again and again. On a CPU the bytes are the fp32 model's own weight
    matrices, which engine.kernels put in one block of memory, so that the measurement adds nothing
    to the peak resident memory the table reports (where they are not in one block, as many bytes
    of its own); on a GPU, 256 MiB of its own."""
    device = model.device
    x = floats_to_read(model, nbytes) if device.type == "cpu" else torch.ones(64 * 2**20, device=device)
    x.sum()
    return lambda: x.numel() * x.element_size() / min(seconds(x.sum, device) for _ in range(5)) / 1e9


def floats_to_read(model: GPT2, nbytes: int) -> torch.Tensor:
    """nbytes (rounded down to whole floats) of the model's weight block, or of a tensor of their own."""
    block = weight_block(model)
    if block is not None and block.numel() >= nbytes:
        return block[:nbytes - nbytes % 4].view(torch.float32)
    return torch.ones(nbytes // 4)


def weight_block(model: GPT2) -> torch.Tensor | None:
    """The bytes of the model's weight matrices, as one uint8 tensor: from the first to the end of
    the last, in the block engine.kernels.weights_on_huge_pages moved them into; None where they
    are not in one block."""
    matrices = [p for p in model.parameters() if p.dim() == 2]
    storage = matrices[0].untyped_storage()
    if any(p.untyped_storage().data_ptr() != storage.data_ptr() for p in matrices):
        return None
    block = torch.empty(0, dtype=torch.uint8).set_(storage)
    first = min(p.data_ptr() for p in matrices) - storage.data_ptr()
    end = max(p.data_ptr() + p.numel() * p.element_size() for p in matrices) - storage.data_ptr()
    return block[first:end]


def projections(model: nn.Module) -> list[nn.Module]:
    """Every projection and the head: the weights a decode step reads."""
    return [m for m in model.modules() if isinstance(m, (nn.Linear, Int8Linear))]


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes a batch-1 decode step must read: every projection and the head (the embedding
    lookup reads one row; biases and LayerNorms are too small to count)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in projections(model))


@torch.inference_mode()
def roofline_breakdown(model: GPT2, prompt: torch.Tensor) -> dict[str, float]:
    """Where batch-1 decoding stands against the roofline, on the model's own weights, best of 5
    each: PyTorch summing its weight matrices one by one in decode order (a plain read of the
    same bytes in the same pieces; the roofline's sum reads one large tensor), the model's
    batch-1 products over the same matrices, and a whole decode step after the prompt."""
    device = prompt.device
    layers = projections(model)
    dtype = model.transformer.wte.weight.dtype
    inputs = [torch.randn(1, 1, m.in_features, device=device, dtype=dtype) for m in layers]
    # int8 read as floats too: summed as integers, PyTorch widens every byte to 64 bits
    weights = [m.weight if m.weight.is_floating_point() else m.weight.view(torch.float32) for m in layers]
    sum_s = min(seconds(lambda: [w.sum() for w in weights], device) for _ in range(5))
    products_s = min(seconds(lambda: [m(x) for m, x in zip(layers, inputs)], device) for _ in range(5))
    cache = new_cache(model, 1, prompt.shape[1] + 6)
    model(prompt, cache=cache, last_only=True)
    step_s = min(seconds(lambda: model(prompt[:, -1:], cache=cache), device) for _ in range(5))
    weight_bytes = weight_bytes_per_token(model)
    return {"weights_sum_gb_s": weight_bytes / sum_s / 1e9, "products_gb_s": weight_bytes / products_s / 1e9,
            "products_ms": 1000 * products_s, "decode_step_ms": 1000 * step_s}


def random_ids(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def random_hf_model() -> transformers.GPT2LMHeadModel:
    """transformers' GPT2LMHeadModel in the 124M shape, with random weights."""
    config = GPT2Config.preset("gpt2")
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **{k: getattr(config, k) for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}))


def build_models(device: torch.device, dtype: torch.dtype):
    """transformers' GPT2LMHeadModel with random weights in the 124M shape, and ours (fp32 and
    int8) holding the very same weights, prepared as the app prepares them (engine.prepare_for_serving)."""
    torch.manual_seed(0)
    config = GPT2Config.preset("gpt2")
    hf = random_hf_model().to(device=device, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None  # random weights: always make every token asked for
    hf.generation_config.pad_token_id = 0
    state = {k: v.to("cpu", torch.float32) for k, v in hf.state_dict().items()}
    ours = GPT2(config)
    ours.load_state_dict(to_our_layout(state, ours, Path("random weights")))
    int8 = GPT2(config)
    int8.load_state_dict(ours.state_dict())
    ours.to(device=device, dtype=dtype).eval()
    int8.to(device=device, dtype=dtype).eval()
    return prepare_for_serving(ours), prepare_for_serving(int8, "int8"), hf


@torch.inference_mode()
def int8_logits_error(ours: GPT2, int8: GPT2, prompt: torch.Tensor) -> float:
    """How far int8's logits for the prompt's next token are from fp32's: the largest difference
    over the largest fp32 logit (the prompt's 32 rows take the int8 kernel)."""
    fp32, rounded = (model(prompt, cache=new_cache(model, 1, prompt.shape[1]), last_only=True) for model in (ours, int8))
    return ((rounded - fp32).abs().max() / fp32.abs().max()).item()


@torch.inference_mode()
def ours_decode(model: GPT2, prompts: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(tokens/s over all rows, seconds to the first token)."""
    device = prompts.device
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    sync(device)
    start, first = time.perf_counter(), None
    for _ in decode_tokens(model, prompts.tolist(), params, [0] * len(prompts)):
        if first is None:
            sync(device)
            first = time.perf_counter() - start
    sync(device)
    return len(prompts) * new_tokens / (time.perf_counter() - start), first


@torch.inference_mode()
def hf_decode(hf, implementation: str, prompt: torch.Tensor, new_tokens: int) -> float:
    hf.set_attn_implementation(implementation)
    elapsed = seconds(lambda: hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                          max_new_tokens=new_tokens, min_new_tokens=new_tokens), prompt.device)
    return new_tokens / elapsed


@torch.inference_mode()
def ours_prefill(model: GPT2, prompt: torch.Tensor) -> float:
    """Seconds from a prompt to its next token's logits, the KV cache filled."""
    return seconds(lambda: model(prompt, cache=new_cache(model, 1, prompt.shape[1]), last_only=True), prompt.device)


@torch.inference_mode()
def hf_prefill(hf, implementation: str, prompt: torch.Tensor) -> float:
    hf.set_attn_implementation(implementation)
    return seconds(lambda: hf(prompt, use_cache=True, logits_to_keep=1), prompt.device)


def alternate(variants: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Run each variant once (warm-up), then `reps` rounds of all of them in turn; each variant's
    numbers, round by round."""
    for run in variants.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps):
        for name, run in variants.items():
            samples[name].append(run())
        print(f"  round {rep + 1}/{reps}: " + ", ".join(f"{n} {v[-1]:.4g}" for n, v in samples.items()), flush=True)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def ratio_per_round(numerators: list[float], denominators: list[float]) -> float:
    """The median over the rounds of each round's numerator / denominator."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def bundled_checks(directory: Path, device: torch.device, new_tokens: int, reps: int) -> dict:
    """Load time, int8/fp32 perplexity and 1 vs 8 scheduler clients on the bundled model; None
    for each when it has not been trained yet."""
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        print(f"bundled model: missing (no weights in {directory})")
        return dict.fromkeys(BUNDLED_KEYS)
    start = time.perf_counter()
    model, tokenizer = in_thread_of_its_own(lambda: serving(directory, device))  # as the app loads it
    load_s = time.perf_counter() - start
    int8, _ = in_thread_of_its_own(lambda: serving(directory, device, "int8"))
    ppl = in_thread_of_its_own(lambda: validation_perplexity({"fp32": model, "int8": int8}, tokenizer, device))
    print(f"bundled model, 1 and {CLIENTS} scheduler clients, fp32 and int8, {reps} rounds:", flush=True)
    clients = alternate({
        "clients1_tok_s": lambda: scheduler_clients(model, tokenizer, 1, new_tokens),
        "clients8_tok_s": lambda: scheduler_clients(model, tokenizer, CLIENTS, new_tokens),
        "clients1_int8_tok_s": lambda: scheduler_clients(int8, tokenizer, 1, new_tokens),
        "clients8_int8_tok_s": lambda: scheduler_clients(int8, tokenizer, CLIENTS, new_tokens),
        "clients8_nokernels_tok_s": without_kernels(lambda: scheduler_clients(model, tokenizer, CLIENTS, new_tokens),
                                                    model),
    }, reps)
    per_round = {f"clients8{suffix}_per_round": ratio_per_round(clients[f"clients8{suffix}_tok_s"],
                                                                clients[f"clients1{suffix}_tok_s"])
                 for suffix in ("", "_int8")}
    per_round["clients8_kernels_gain_per_round"] = ratio_per_round(clients["clients8_tok_s"],
                                                                   clients["clients8_nokernels_tok_s"])
    return {"bundled_load_s": load_s, "bundled_int8_ppl_ratio": ppl["int8"] / ppl["fp32"], **medians(clients),
            **per_round}


def serving(directory: Path, device: torch.device, quantize: str | None = None):
    model, tokenizer = load_pretrained(directory, device=device)
    return prepare_for_serving(model, quantize), tokenizer


def without_kernels(run: Callable[[], float], model: nn.Module) -> Callable[[], float]:
    """`run` on PyTorch's path as a machine without the kernels runs it, int8 weights row by row
    (not packed, which PyTorch's product would unpack at every call): the side-by-side that decides
    whether the kernels stay."""
    def switched_off() -> float:
        with kernels.switched_off(), row_by_row(model):
            return run()
    return switched_off


@contextmanager
def row_by_row(model: nn.Module):
    """The model's packed int8 weights row by row for a while, then back in their own memory (on
    huge pages, as install put them)."""
    packed = {m: m.weight.data for m in model.modules() if isinstance(m, Int8Linear) and m.packed}
    for layer, weight in packed.items():
        layer.weight.data = unpack(weight)
    try:
        yield
    finally:
        for layer, weight in packed.items():
            layer.weight.data = weight


def validation_perplexity(models: dict[str, GPT2], tokenizer, device: torch.device) -> dict[str, float]:
    """Each model's perplexity on the first windows of each pretraining validation source, averaged."""
    from train.pretrain import pretraining_streams, validation_loss

    val_data = pretraining_streams(tokenizer, "val")
    return {name: math.exp(validation_loss(model, val_data, model.config.n_positions, device, max_windows=16)["val_loss"])
            for name, model in models.items()}


def scheduler_clients(model: GPT2, tokenizer, n_clients: int, new_tokens: int) -> float:
    """Aggregate generated tokens/s of n_clients threads streaming through one Scheduler at once,
    each with its own seed: the app's generation path, without HTTP."""
    scheduler = Scheduler(model, max_batch=CLIENTS)
    results = [None] * n_clients
    barrier = threading.Barrier(n_clients + 1)

    def client(i: int) -> None:
        barrier.wait()
        params = SamplingParams(temperature=0.8, top_k=40, seed=i, max_new_tokens=new_tokens)
        results[i] = generate(scheduler, tokenizer, "Once upon a time", params)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return sum(r.generated_tokens for r in results) / elapsed


def load_times(device: torch.device, dtype: torch.dtype, reps: int) -> dict[str, float]:
    """Seconds to load a checkpoint of the 124M shape (random weights, saved by transformers, with
    the bundled tokenizer beside them), ours and transformers' alternating, medians."""
    with tempfile.TemporaryDirectory() as folder:
        random_hf_model().save_pretrained(folder)
        shutil.copy(BUNDLED_DIR / "tokenizer.model", folder)
        print(f"loading a checkpoint of the 124M shape, {reps} rounds:", flush=True)
        rounds = alternate({
            "load_ours_s": lambda: seconds(lambda: load_pretrained(folder, device=device, dtype=dtype), device),
            "load_hf_s": lambda: seconds(lambda: transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=dtype)
                                         .to(device), device),
        }, reps)
    return medians(rounds)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def machine() -> str:
    cpu = cpu_name()
    if torch.cuda.is_available():
        cpu += f", {torch.cuda.get_device_name()}"
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads, "
            f"{torch.backends.cpu.get_cpu_capability()}), transformers {transformers.__version__}")


def table(n: dict, device: torch.device, dtype: torch.dtype, new_tokens: int, reps: int) -> str:
    hf_best = max(n["hf_sdpa_tok_s"], n["hf_eager_tok_s"])
    # The GPT-2 small rows run in --dtype (the JSON keys keep issue 5's "fp32" names); the bundled
    # model's rows always run in fp32.
    width = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]

    def opt(value, fmt="{:.1f}"):
        return "missing" if value is None else fmt.format(value)

    def per_round(key, fmt="{:.2f}x"):
        return "" if n.get(key) is None else f" (per round {fmt.format(n[key])})"

    labels = {"fp32": f"batch 1 {width}", "int8": "batch 1 int8", "batch8": f"batch {BATCH} {width}",
              "int8_batch8": f"batch {BATCH} int8"}  # FRACTIONS' decode figures
    fractions = " · ".join(f"{label} {n[f'{name}_roofline_fraction']:.0%}"
                           + per_round(f"{name}_roofline_per_round", "{:.0%}") for name, label in labels.items())
    rows = [
        (f"decode, batch 1, {width} (tokens/s)", f"{n['ours_fp32_tok_s']:.1f}",
         f"sdpa {n['hf_sdpa_tok_s']:.1f} · eager {n['hf_eager_tok_s']:.1f}",
         f"{n['ours_fp32_tok_s'] / hf_best:.2f}x the faster" + per_round("fp32_vs_hf_per_round")),
        ("decode, batch 1, int8 weights (tokens/s)", f"{n['ours_int8_tok_s']:.1f}", "",
         f"{n['ours_int8_tok_s'] / hf_best:.2f}x the faster" + per_round("int8_vs_hf_per_round")),
        (f"decode, batch {BATCH}, {width} (tokens/s, all rows)", f"{n['ours_batch8_tok_s']:.1f}", "",
         f"{n['ours_batch8_tok_s'] / n['ours_fp32_tok_s']:.2f}x our batch 1" + per_round("batch8_per_round")),
        (f"decode, batch {BATCH}, int8 weights (tokens/s, all rows)", f"{n['ours_int8_batch8_tok_s']:.1f}", "",
         f"{n['ours_int8_batch8_tok_s'] / n['ours_int8_tok_s']:.2f}x our int8 batch 1"),
        (f"prefill, {PREFILL_TOKENS}-token prompt (ms)", f"{n['prefill512_ours_ms']:.0f}",
         f"sdpa {n['prefill512_hf_sdpa_ms']:.0f} · eager {n['prefill512_hf_eager_ms']:.0f}",
         f"{n['prefill512_hf_ms'] / n['prefill512_ours_ms']:.2f}x as fast as the faster" + per_round("prefill_per_round")),
        (f"time to first token, {PROMPT_TOKENS}-token prompt (ms)", f"{n['ttft_ms']:.0f}", "", ""),
        (f"read bandwidth over the {width} / int8 weights' bytes (GB/s)",
         f"{n['bandwidth_gb_s']:.1f} / {n['bandwidth_int8_gb_s']:.1f}", "",
         f"rounds {n['bandwidth_low_gb_s']:.1f}-{n['bandwidth_high_gb_s']:.1f} / "
         f"{n['bandwidth_int8_low_gb_s']:.1f}-{n['bandwidth_int8_high_gb_s']:.1f}"),
        (f"roofline at batch 1, {width} / int8 (tokens/s)",
         f"{n['roofline_fp32_tok_s']:.1f} / {n['roofline_int8_tok_s']:.1f}", "", ""),
        ("decode as a fraction of its roofline", "", "", fractions),
        ("int8 products: the integer dot products taken", n["int8_dot"], "", ""),
        ("int8 logits against fp32, 32-token prompt (largest difference / largest logit)",
         f"{n['int8_logits_error']:.4f}", "", ""),
        ("the weights, summed matrix by matrix (GB/s)", f"{n['weights_sum_gb_s']:.1f}", "",
         f"{n['weights_sum_gb_s'] / n['bandwidth_gb_s']:.0%} of the bandwidth"),
        ("our batch-1 products over the same matrices (GB/s; ms per token)", f"{n['products_gb_s']:.1f}; {n['products_ms']:.1f}",
         "", f"{n['products_gb_s'] / n['bandwidth_gb_s']:.0%} of the bandwidth"),
        ("one batch-1 decode step (ms)", f"{n['decode_step_ms']:.1f}", "",
         f"{1000 / (n['roofline_fp32_tok_s'] * n['decode_step_ms']):.0%} of the roofline"),
        ("int8: the weights summed / our batch-1 products (GB/s; ms per token)",
         f"{n['int8_weights_sum_gb_s']:.1f} / {n['int8_products_gb_s']:.1f}; {n['int8_products_ms']:.1f}", "",
         f"products at {n['int8_products_gb_s'] / n['bandwidth_int8_gb_s']:.0%} of the bandwidth"),
        ("int8: one batch-1 decode step (ms)", f"{n['int8_decode_step_ms']:.1f}", "",
         f"{1000 / (n['roofline_int8_tok_s'] * n['int8_decode_step_ms']):.0%} of the roofline; the products "
         f"{n['int8_products_ms'] / n['int8_decode_step_ms']:.0%} of it"),
        *[(f"the decode kernels' gain: {label} (tokens/s, on / off)",
            f"{n[f'ours_{key}_tok_s']:.1f} / {n[f'ours_{key}_nokernels_tok_s']:.1f}", "",
            f"{n[f'ours_{key}_tok_s'] / n[f'ours_{key}_nokernels_tok_s']:.2f}x" + per_round(f"{key}_kernels_gain_per_round"))
          for key, label in labels.items()],
        ("peak resident memory of this process (MB)", f"{n['peak_rss_mb']:.0f}", "", "both models loaded"),
        ("load a checkpoint of the 124M shape (s)", f"{n['load_ours_s']:.2f}", f"{n['load_hf_s']:.2f}",
         f"{n['load_hf_s'] / n['load_ours_s']:.2f}x as fast (ours makes every weight its own memory and loads the "
         "tokenizer; transformers reads each weight when first used)"),
        ("bundled model: load time (s)", opt(n["bundled_load_s"], "{:.2f}"), "", ""),
        ("bundled model: int8 / fp32 validation perplexity", opt(n["bundled_int8_ppl_ratio"], "{:.4f}"), "", ""),
    ]
    for label, suffix in (("fp32", ""), ("int8", "_int8")):
        one, many = n[f"clients1{suffix}_tok_s"], n[f"clients{CLIENTS}{suffix}_tok_s"]
        rows.append((f"bundled model, {label}: scheduler, 1 / {CLIENTS} clients (tokens/s, all clients)",
                     f"{opt(one)} / {opt(many)}", "",
                     "" if one is None else f"{many / one:.2f}x" + per_round(f"clients{CLIENTS}{suffix}_per_round")))
    if n.get("clients8_nokernels_tok_s") is not None:
        rows.append((f"the decode kernels' gain: bundled fp32, {CLIENTS} clients (tokens/s, on / off)",
                     f"{n['clients8_tok_s']:.1f} / {n['clients8_nokernels_tok_s']:.1f}", "",
                     f"{n['clients8_tok_s'] / n['clients8_nokernels_tok_s']:.2f}x"
                     + per_round("clients8_kernels_gain_per_round")))
    lines = [f"GPT-2 124M shape, random weights, {device.type} {str(dtype).removeprefix('torch.')}, greedy, "
             f"{new_tokens} new tokens, median of {reps} alternating runs",
             f"machine: {machine()}", "",
             "| measurement | ours | transformers | comparison |", "|---|---:|---:|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="weights and activations (int8 keeps its scales in this dtype)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per decode run")
    p.add_argument("--reps", type=int, default=3, help="alternating rounds; each number is their median")
    p.add_argument("--bundled", type=Path, default=BUNDLED_DIR, help="the bundled model's directory")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"machine: {machine()}", flush=True)
    print(f"decode kernels: {'built' if kernels.wait_until_built() else kernels.decode_path()}", flush=True)
    # As in the app (serve/model_host.py), PyTorch's parallel work other than the scheduler's runs in
    # threads that have ended before the clients run, so the scheduler's thread keeps the only
    # OpenMP workers (engine/scheduler.py, in_thread_of_its_own).
    n = in_thread_of_its_own(lambda: against_transformers(args, device, dtype))
    n.update(bundled_checks(args.bundled, device, args.new_tokens, args.reps))
    n["peak_rss_mb"] = peak_rss_mb()
    n.update(in_thread_of_its_own(lambda: load_times(device, dtype, args.reps)))
    print(table(n, device, dtype, args.new_tokens, args.reps))
    if args.json:
        args.json.write_text(json.dumps({**{k: n[k] for k in KEYS}, **n}, indent=2) + "\n")
        print(f"wrote {args.json}")


def against_transformers(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Every measurement on GPT-2 small's shape, ours and transformers' alternating."""
    ours, int8, hf = build_models(device, dtype)
    fp32_bytes, int8_bytes = weight_bytes_per_token(ours), weight_bytes_per_token(int8)
    vocab = ours.config.vocab_size
    prompt = random_ids(vocab, 1, PROMPT_TOKENS, seed=1).to(device)
    breakdown = roofline_breakdown(ours, prompt)
    breakdown.update({f"int8_{key}": value for key, value in roofline_breakdown(int8, prompt).items()})
    batch = random_ids(vocab, BATCH, PROMPT_TOKENS, seed=2).to(device)
    long_prompt = random_ids(vocab, 1, PREFILL_TOKENS, seed=3).to(device)
    first_token_s: list[float] = []
    logits_error = int8_logits_error(ours, int8, prompt)

    def ours_fp32() -> float:
        tok_s, first = ours_decode(ours, prompt, args.new_tokens)
        first_token_s.append(first)
        return tok_s

    print(f"decode and prefill, {args.reps} rounds:", flush=True)
    rounds = alternate({
        "bandwidth_gb_s": read_bandwidth(ours, fp32_bytes),
        "bandwidth_int8_gb_s": read_bandwidth(ours, int8_bytes),
        "ours_fp32_tok_s": ours_fp32,
        "ours_int8_tok_s": lambda: ours_decode(int8, prompt, args.new_tokens)[0],
        "hf_sdpa_tok_s": lambda: hf_decode(hf, "sdpa", prompt, args.new_tokens),
        "hf_eager_tok_s": lambda: hf_decode(hf, "eager", prompt, args.new_tokens),
        "ours_batch8_tok_s": lambda: ours_decode(ours, batch, args.new_tokens)[0],
        "ours_int8_batch8_tok_s": lambda: ours_decode(int8, batch, args.new_tokens)[0],
        "ours_fp32_nokernels_tok_s": without_kernels(lambda: ours_decode(ours, prompt, args.new_tokens)[0], ours),
        "ours_int8_nokernels_tok_s": without_kernels(lambda: ours_decode(int8, prompt, args.new_tokens)[0], int8),
        "ours_batch8_nokernels_tok_s": without_kernels(lambda: ours_decode(ours, batch, args.new_tokens)[0], ours),
        "ours_int8_batch8_nokernels_tok_s": without_kernels(lambda: ours_decode(int8, batch, args.new_tokens)[0],
                                                            int8),
        "prefill512_ours_ms": lambda: 1000 * ours_prefill(ours, long_prompt),
        "prefill512_hf_sdpa_ms": lambda: 1000 * hf_prefill(hf, "sdpa", long_prompt),
        "prefill512_hf_eager_ms": lambda: 1000 * hf_prefill(hf, "eager", long_prompt),
    }, args.reps)
    n = medians(rounds)
    n["prefill512_hf_ms"] = min(n["prefill512_hf_sdpa_ms"], n["prefill512_hf_eager_ms"])
    n["ttft_ms"] = 1000 * statistics.median(first_token_s[1:])  # the warm-up run's is left out
    n["roofline_fp32_tok_s"] = n["bandwidth_gb_s"] * 1e9 / fp32_bytes
    n["roofline_int8_tok_s"] = n["bandwidth_int8_gb_s"] * 1e9 / int8_bytes
    for key in ("bandwidth", "bandwidth_int8"):
        n[f"{key}_low_gb_s"], n[f"{key}_high_gb_s"] = min(rounds[f"{key}_gb_s"]), max(rounds[f"{key}_gb_s"])
    n["int8_dot"] = kernels.INT8_DOT if kernels.decode_kernels() is not None else kernels.decode_path()
    n["int8_logits_error"] = logits_error
    rooflines = {"roofline_fp32_tok_s": [gb_s * 1e9 / fp32_bytes for gb_s in rounds["bandwidth_gb_s"]],
                 "roofline_int8_tok_s": [gb_s * 1e9 / int8_bytes for gb_s in rounds["bandwidth_int8_gb_s"]]}
    for name, (tok_s, roofline, rows) in FRACTIONS.items():
        n[f"{name}_roofline_fraction"] = n[tok_s] / (rows * n[roofline])
        n[f"{name}_roofline_per_round"] = ratio_per_round(rounds[tok_s], [rows * r for r in rooflines[roofline]])

    hf_best = list(map(max, rounds["hf_sdpa_tok_s"], rounds["hf_eager_tok_s"]))
    n.update({
        "fp32_vs_hf_per_round": ratio_per_round(rounds["ours_fp32_tok_s"], hf_best),
        "int8_vs_hf_per_round": ratio_per_round(rounds["ours_int8_tok_s"], hf_best),
        "batch8_per_round": ratio_per_round(rounds["ours_batch8_tok_s"], rounds["ours_fp32_tok_s"]),
        "prefill_per_round": ratio_per_round(list(map(min, rounds["prefill512_hf_sdpa_ms"],
                                                      rounds["prefill512_hf_eager_ms"])), rounds["prefill512_ours_ms"]),
        **{f"{name}_kernels_gain_per_round": ratio_per_round(rounds[f"ours_{name}_tok_s"],
                                                             rounds[f"ours_{name}_nokernels_tok_s"])
           for name in FRACTIONS},
    })
    n.update(breakdown)
    return n


if __name__ == "__main__":
    main()

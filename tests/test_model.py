"""Equivalence with transformers' GPT2LMHeadModel, the reference nobody here wrote (after minGPT's
test_huggingface_import.py): same logits, same greedy continuation, same cache behaviour."""
from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from model import GPT2, GPT2Config, load_pretrained, save_pretrained
from engine import generate
from engine.cache import new_cache
from engine.generate import SamplingParams, decode_tokens

from .conftest import REPO, make_hf_checkpoint

SHAPES = {
    "gpt2-124M": dict(n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "heads-not-power-of-two": dict(n_positions=64, n_embd=96, n_layer=2, n_head=6),
    "vocab-not-multiple-of-64": dict(vocab_size=1001, n_positions=64, n_embd=64, n_layer=2, n_head=4),
    "deeper-than-wide": dict(n_positions=64, n_embd=32, n_layer=12, n_head=2),
}


# GPT-2's own size takes most of this file's time: the fast tier (-m "not slow") leaves it out, and
# proves the same equivalences on the small shapes.
FULL_SIZE = "gpt2-124M"


@pytest.fixture(scope="module", params=[pytest.param((s, w), marks=[pytest.mark.slow] if s == FULL_SIZE else [])
                                        for s in SHAPES for w in ("safetensors", "bin")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def pair(request, tmp_path_factory):
    """(ours, transformers') loaded from the same checkpoint directory."""
    shape, weights = request.param
    directory = make_hf_checkpoint(tmp_path_factory.mktemp(shape), weights=weights, **SHAPES[shape])
    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    ours, _ = load_pretrained(directory)
    return ours, hf


def prompt_ids(model: GPT2, length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


@torch.no_grad()
def test_logits_equal_transformers(pair):
    ours, hf = pair
    ids = prompt_ids(ours, 24, batch=2)
    assert ours(ids).shape == (2, 24, ours.config.vocab_size)
    assert (ours(ids) - hf(ids).logits).abs().max() < 1e-4


@torch.no_grad()
def test_greedy_continuation_equals_transformers_generate(pair):
    ours, hf = pair
    ids = prompt_ids(ours, 8)
    hf.generation_config.eos_token_id = None  # random weights: never stop early, compare all 32
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                           pad_token_id=0)[0, 8:].tolist()
    tokens = [int(t[0]) for t in decode_tokens(ours, [ids[0].tolist()], SamplingParams(temperature=0,
                                                                                        max_new_tokens=32), [0])]
    assert tokens == expected


@torch.no_grad()
def test_kv_cache_steps_equal_full_recompute(pair):
    ours, _ = pair
    ids = prompt_ids(ours, 20, batch=2)
    full = ours(ids)
    cache = new_cache(ours, 2, 20)
    steps = [ours(ids[:, :6], cache=cache)] + [ours(ids[:, t:t + 1], cache=cache) for t in range(6, 20)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_a_prompt_in_chunks_gives_the_logits_of_one_call(pair, monkeypatch, padded):
    """Prompts go in by chunks (generate.prefill_chunk); with or without left padding (that
    fills a whole chunk of one row), the logits and the cache equal one call's."""
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 4)
    ours, _ = pair
    ids = prompt_ids(ours, 11, batch=2)
    real = torch.ones_like(ids)
    if padded:
        real[0, :9] = 0  # row 0: two real tokens after a whole chunk and more of padding
    whole_cache, chunks_cache = new_cache(ours, 2, 12), new_cache(ours, 2, 12)
    whole = ours(ids, attention_mask=real, cache=whole_cache, last_only=True)[:, -1]
    done = 0
    while done < ids.shape[1]:
        done, chunked = generate.prefill_chunk(ours, ids, chunks_cache, done, attention_mask=real)
    assert (chunked - whole).abs().max() < 1e-5
    step = prompt_ids(ours, 1, batch=2, seed=9)
    assert (ours(step, cache=chunks_cache) - ours(step, cache=whole_cache)).abs().max() < 1e-5


@pytest.mark.parametrize("chunk", [generate.PREFILL_CHUNK, 4])  # one call, or chunks with padding across them
@torch.no_grad()
def test_left_padded_batch_gives_each_row_its_own_tokens(tiny_checkpoint, monkeypatch, chunk):
    monkeypatch.setattr(generate, "PREFILL_CHUNK", chunk)
    model, _ = load_pretrained(tiny_checkpoint)
    prompts = [prompt_ids(model, n, seed=n)[0].tolist() for n in (3, 11, 7)]
    for params in (SamplingParams(temperature=0, max_new_tokens=12),
                   SamplingParams(temperature=0.9, top_k=40, repetition_penalty=1.3, max_new_tokens=12)):
        seeds = [5, 6, 7]
        batch = torch.stack(list(decode_tokens(model, prompts, params, seeds)), dim=1)
        for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
            alone = torch.cat(list(decode_tokens(model, [prompt], params, [seed])))
            assert batch[row].tolist() == alone.tolist()


@torch.no_grad()
def test_our_save_pretrained_loads_in_transformers(tmp_path):
    config = GPT2Config(vocab_size=50257, n_positions=64, n_embd=48, n_layer=3, n_head=3)
    torch.manual_seed(3)
    ours = GPT2(config).eval()
    _, tokenizer = load_pretrained(make_hf_checkpoint(tmp_path / "src", n_positions=8, n_embd=8, n_layer=1, n_head=1))
    save_pretrained(ours, tokenizer, tmp_path / "saved")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "saved").eval()
    reloaded, reloaded_tokenizer = load_pretrained(tmp_path / "saved")
    ids = prompt_ids(ours, 16, batch=2)
    assert (hf(ids).logits - ours(ids)).abs().max() < 1e-5
    assert torch.equal(reloaded(ids), ours(ids))
    assert reloaded_tokenizer.encode("Hello there") == tokenizer.encode("Hello there")


def huge_page_kib(address: int) -> int:
    """The KiB of 2 MiB pages in this process's memory mapping that holds `address`."""
    mapping = None
    for line in open("/proc/self/smaps"):
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header: start-end perms ...
            start, end = (int(x, 16) for x in first.split("-"))
            mapping = start <= address < end
        elif mapping and first == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@torch.no_grad()
def test_a_served_model_keeps_its_weights_in_one_block_on_huge_pages(tmp_path):
    """The engine moves a loaded model's weight matrices into one block of memory on 2 MiB pages
    (engine.kernels.weights_on_huge_pages): the same values, the head still tied, and the model
    saves and loads back as before."""
    from engine import prepare_for_serving

    directory = make_hf_checkpoint(tmp_path / "src", n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model, tokenizer = load_pretrained(directory)
    prepare_for_serving(model)
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert len(matrices) == 2 + 4 * 2  # wte (the head too), wpe, four per block
    assert len({p.untyped_storage().data_ptr() for p in matrices}) == 1
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not maps_file(directory / "model.safetensors")  # the vectors too are the model's own memory
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.is_file() and "[never]" not in thp.read_text():
        assert huge_page_kib(model.transformer.wte.weight.data_ptr()) >= 2048  # wte alone is 12.9 MB
    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    ids = prompt_ids(model, 16, batch=2)
    assert (hf(ids).logits - model(ids)).abs().max() < 1e-5
    save_pretrained(model, tokenizer, tmp_path / "saved")
    reloaded, _ = load_pretrained(tmp_path / "saved")
    assert torch.equal(prepare_for_serving(reloaded)(ids), model(ids))


def maps_file(path: Path) -> bool:
    """Whether this process still maps the file (safetensors maps a checkpoint to read it)."""
    gc.collect()
    return any(line.rstrip().endswith(str(path)) for line in Path("/proc/self/maps").read_text().splitlines())


@torch.no_grad()
def test_a_loaded_model_has_its_weights_contiguous_its_own_and_its_head_tied(tmp_path):
    """load_pretrained takes the file's tensors as they are (Conv1D weights as transposed views):
    each is made contiguous, in nn.Linear's memory order (the decode kernels take only that), and
    the model's own copy, so that the file is let go; the head stays tied. The logits equal
    transformers'."""
    directory = make_hf_checkpoint(tmp_path / "src", n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model, _ = load_pretrained(directory)
    assert all(p.is_contiguous() for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not maps_file(directory / "model.safetensors")  # nothing of the model is a view of the file
    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    ids = prompt_ids(model, 16, batch=2)
    assert (hf(ids).logits - model(ids)).abs().max() < 1e-5


@torch.no_grad()
def test_post_ln_and_no_final_norm_differ_from_pre_ln():
    ids = torch.randint(0, 100, (1, 10))
    logits = {}
    for name, overrides in {"pre": {}, "post": dict(norm_position="post"), "no_ln_f": dict(final_norm=False)}.items():
        torch.manual_seed(0)  # the same weights in all three
        model = GPT2(GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2, n_head=2, **overrides))
        logits[name] = model(ids)
        assert torch.isfinite(logits[name]).all()
    assert not torch.allclose(logits["pre"], logits["post"], atol=1e-3)
    assert not torch.allclose(logits["pre"], logits["no_ln_f"], atol=1e-3)


def test_presets_have_the_released_shapes():
    xl = GPT2Config.preset("openai-community/gpt2-xl")
    assert (xl.n_layer, xl.n_embd, xl.n_head) == (48, 1600, 25)
    assert GPT2Config.preset("distilgpt2").n_layer == 6
    model = GPT2(GPT2Config.preset("gpt2"))
    assert model.num_parameters() == 124_439_808  # the published 124M count (ties counted once)
    with pytest.raises(ValueError, match="unknown preset"):
        GPT2Config.preset("gpt5")


def test_config_json_round_trip_with_transformers(tmp_path):
    from transformers import GPT2Config as HFConfig

    config = GPT2Config(vocab_size=1234, n_positions=77, n_embd=40, n_layer=5, n_head=5, norm_position="post")
    config.save(tmp_path)
    hf = HFConfig.from_pretrained(tmp_path)
    assert (hf.vocab_size, hf.n_positions, hf.n_embd, hf.n_layer, hf.n_head) == (1234, 77, 40, 5, 5)
    assert GPT2Config.load(tmp_path) == config


@pytest.mark.slow  # a fresh interpreter
def test_the_model_package_imports_nothing_of_the_engine_training_or_ui():
    """model/ is the network and its files: importing it (and loading a checkpoint) brings in no
    engine, training, task or UI code, no Gradio and no compiled kernels."""
    code = """
import sys
import model
from model import GPT2, GPT2Config, load_pretrained, save_pretrained
from model import adapters, checkpoint, config, gpt2, tokenizer
model.load_pretrained()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("engine", "train", "tasks", "ui", "gradio", "app")
                or "studio_decode_kernels" in m)
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("config", [GPT2Config.preset("gpt2"), GPT2Config.preset("distilgpt2", final_norm=False),
                                    GPT2Config(vocab_size=300, n_positions=16, n_embd=8, n_layer=3, n_head=2)],
                         ids=["gpt2", "distilgpt2-no-ln_f", "small"])
def test_the_config_counts_the_parameters_before_any_weight_is_read(config):
    """What the app's memory check reads from config.json: the model's own count, head counted once."""
    with torch.device("meta"):
        model = GPT2(config)
    assert config.parameter_count == model.num_parameters()
    assert GPT2Config.preset("gpt2").parameter_count == 124_439_808  # GPT-2 small's published 124M

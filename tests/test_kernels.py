"""The decode kernels (model/kernels.py): built where they can be, equal to PyTorch's products and
attention up to rounding, the same for a row alone or in a batch, and out of the way of
gradients and large calls."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from model import GPT2, GPT2Config, gpt2, kernels
from model.gpt2 import Linear
from model.quantize import Int8Linear, quantize_weights

from .conftest import REPO

# in_features 100 and 120 leave tails after the last full step (16 or 32 wide: fp32 or int8,
# AVX2 or AVX-512), and 37 outputs a part of a block of weight rows; 768 is GPT-2's width.
SHAPES = [(100, 37), (120, 37), (768, 300)]


def test_the_kernels_are_built_on_an_avx2_cpu():
    """Where the CPU has AVX2 (this machine and CI), a failed build must not pass unnoticed as a
    slow fallback."""
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert kernels.decode_kernels() is not None
    else:
        assert kernels.decode_kernels() is None


def layer(kind: str, in_features: int, out_features: int, bias: bool) -> torch.nn.Module:
    torch.manual_seed(in_features + out_features + bias)
    fp32 = Linear(in_features, out_features, bias=bias)
    if bias:
        torch.nn.init.normal_(fp32.bias)  # not the zeros of a fresh layer: the bias must show
    return fp32 if kind == "fp32" else Int8Linear(fp32.weight, fp32.bias)


def pytorch_product(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, Int8Linear):
        y = F.linear(x, module.weight.float()) * module.scale
        return y if module.bias is None else y + module.bias
    return F.linear(x, module.weight, module.bias)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
@pytest.mark.parametrize("in_features,out_features", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_a_decode_step_runs_on_the_kernel_and_equals_pytorch(kind, in_features, out_features, bias):
    module = layer(kind, in_features, out_features, bias)
    x = torch.randn(kernels.KERNEL_ROWS, 1, in_features)  # a full batch of one token each
    scale = module.scale if kind == "int8" else None
    direct = kernels.linear(x, module.weight, module.bias, scale)
    assert direct is not None and direct.shape == (kernels.KERNEL_ROWS, 1, out_features)
    assert torch.equal(module(x), direct)  # the layer took the kernel
    expected = pytorch_product(module, x)
    assert (direct - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("kind", ["fp32", "int8"])
# 40, 100, 120: shorter than two of int8's steps (16 wide with AVX2, 32 with AVX-512), and tails
# past the last full step of either width; 768: no tail.
@pytest.mark.parametrize("in_features", [40, 100, 120, 768])
@torch.no_grad()
def test_a_row_gives_the_same_bits_alone_or_in_any_batch(kind, in_features):
    module = layer(kind, in_features, 301, bias=True)  # 301: blocks of weight rows do not divide it
    x = torch.randn(kernels.KERNEL_ROWS, in_features)
    alone = torch.cat([module(x[row:row + 1]) for row in range(len(x))])
    for rows in (2, 3, 5, 8, 13, kernels.KERNEL_ROWS):  # passes (up to 4 rows), and blocks
        assert torch.equal(module(x[:rows]), alone[:rows])


@torch.no_grad()
def test_prompts_and_odd_inputs_go_to_pytorch():
    weight, bias = torch.randn(300, 768), torch.randn(300)
    assert kernels.linear(torch.randn(1, kernels.KERNEL_ROWS + 1, 768), weight, bias) is None  # a prompt
    assert kernels.linear(torch.randn(2, 768, dtype=torch.float64), weight.double(), bias.double()) is None
    assert kernels.linear(torch.randn(2, 768), weight.t().contiguous().t(), bias) is None  # not row-major
    assert kernels.linear(torch.randn(2, 768), weight, bias[:10]) is None
    assert kernels.linear(torch.randn(2, 768), weight.to(torch.int8), bias) is None  # int8 needs its scales
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # a shape mismatch is PyTorch's to name
        Linear(768, 300)(torch.randn(2, 700))


def test_gradients_go_through_pytorch():
    module = Linear(64, 8)
    x = torch.randn(2, 64)
    module(x).sum().backward()
    assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert kernels.linear(x, module.weight, module.bias) is not None


def cache_views(rows: int, slots: int, heads: int = 3, dim: int = 16, room: int = 50):
    """A query (rows, heads, 1, dim) laid out as the model makes it (a transposed view), and keys
    and values (rows, heads, slots, dim) as views of a longer cache, as the KV cache hands them."""
    keys, values = torch.randn(2, rows, heads, room, dim).unbind(0)
    q = torch.randn(rows, 1, heads, dim).transpose(1, 2)
    return q, keys[:, :, :slots], values[:, :, :slots]


def projection_views(rows: int, slots: int, heads: int = 2, dim: int = 64):
    """Keys and values straight from a projection (rows, slots, heads * dim), split into heads by
    a transposed view, as a forward call without a cache hands them."""
    q = torch.randn(rows, 1, heads, dim).transpose(1, 2)
    k, v = (torch.randn(rows, slots, heads, dim).transpose(1, 2) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("slots", [1, 5, 8, 37])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("views", [cache_views, projection_views])
@torch.no_grad()
def test_decode_attention_equals_pytorch(slots, masked, views):
    torch.manual_seed(slots)
    q, k, v = views(rows=4, slots=slots)
    mask = None
    if masked:  # padding and other rows' slots, as causal_padding_mask makes them; the query sees itself
        mask = torch.rand(4, 1, 1, slots) > 0.4
        mask[..., -1] = True
    got = kernels.decode_attention(q, k, v, mask)
    assert got is not None and got.shape == q.shape
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


@torch.no_grad()
def test_attention_of_a_row_gives_the_same_bits_beside_longer_rows():
    """In the scheduler's batch a row sits beside rows with more slots, which it must not see."""
    q, k, v = cache_views(rows=3, slots=40)
    mask = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    mask[0, ..., 13:] = False  # row 0 has 13 slots, the others 40
    together = kernels.decode_attention(q, k, v, mask)
    alone = kernels.decode_attention(q[:1], k[:1, :, :13], v[:1, :, :13], None)
    assert torch.equal(together[:1], alone)


@torch.no_grad()
def test_prompts_and_odd_attention_inputs_go_to_pytorch():
    q, k, v = cache_views(rows=2, slots=9)
    assert kernels.decode_attention(torch.randn(2, 3, 4, 16), k, v, None) is None  # a prompt's queries
    assert kernels.decode_attention(q.double(), k.double(), v.double(), None) is None
    q12, k12, v12 = cache_views(rows=2, slots=9, dim=12)  # dim not a multiple of 8
    assert kernels.decode_attention(q12, k12, v12, None) is None
    assert kernels.decode_attention(q, k, v[:, :, :8], None) is None
    assert kernels.decode_attention(q, k, v, torch.ones(2, 3, 1, 9, dtype=torch.bool)) is None  # a mask per head
    leaf = q.clone().requires_grad_()
    with torch.enable_grad():
        assert kernels.decode_attention(leaf, k, v, None) is None


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_decode_steps_take_the_attention_kernel(monkeypatch, padded):
    """Decode steps over the KV cache run on the kernel, with no mask (rows of one length) and
    with one (left-padded rows), and give PyTorch's logits."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2)).eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]] if not padded else [[5, 6, 7, 8], [9, 10]]
    tokens = torch.tensor([[t, t + 1, t + 2] for t in (20, 30)])

    def decode_steps() -> torch.Tensor:
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        real = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        cache = model.new_cache(2, width + tokens.shape[1])
        model(ids, attention_mask=real, cache=cache)
        assert cache.has_padding == padded
        return torch.cat([model(tokens[:, i:i + 1], cache=cache) for i in range(tokens.shape[1])], dim=1)

    pytorch_calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(gpt2.F, "scaled_dot_product_attention", lambda *a, **kw: pytorch_calls.append(1) or sdpa(*a, **kw))
    with_kernel = decode_steps()
    prefill_calls = model.config.n_layer
    assert len(pytorch_calls) == prefill_calls  # the prompt's; none for the steps
    monkeypatch.setattr(kernels, "decode_attention", lambda *args: None)
    monkeypatch.setattr(kernels, "decode_blocks", lambda *args: None)  # the steps' blocks through the modules
    expected = decode_steps()
    assert len(pytorch_calls) == 2 * prefill_calls + tokens.numel() // 2 * model.config.n_layer
    assert (with_kernel - expected).abs().max() <= 1e-5 * expected.abs().max()


def scheduler_like_cache(model: GPT2, prompts: list[list[int]], room: int, adapters: list[str | None] | None = None):
    """A batch cache whose rows were each prefilled alone (with the row's adapter) and copied in,
    so they stand at different lengths, as the scheduler's rows do."""
    from model.adapters import active_adapter

    cache = model.new_cache(len(prompts) + 1, max(map(len, prompts)) + room)  # a spare row, as the scheduler has
    for row, (prompt, adapter) in enumerate(zip(prompts, adapters or [None] * len(prompts))):
        alone = model.new_cache(1, len(prompt))
        with active_adapter(adapter):
            model(torch.tensor([prompt]), cache=alone)
        cache.copy_row(row, alone)
    return cache


@pytest.mark.parametrize("kind", ["fp32", "int8"])
@pytest.mark.parametrize("rows", ["one length", "left-padded", "different lengths"])
@pytest.mark.parametrize("adapter", [None, "chat", "per row"])
@torch.inference_mode()
def test_a_decode_step_in_one_call_gives_the_modules_bits(monkeypatch, tmp_path, kind, rows, adapter):
    """kernels.decode_blocks runs all the blocks of a decode step in one call; the logits are
    bit for bit those of the blocks' modules, over several steps, with an adapter on for every
    row or for one row of two (the scheduler's crowd) as without."""
    from model.adapters import active_adapter, load_adapter

    from .conftest import make_lora_adapter

    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=3, n_head=2)).eval()
    adapter_dir = make_lora_adapter(model, tmp_path / "chat")
    if kind == "int8":
        model = quantize_weights(model)
    load_adapter(model, adapter_dir, "chat")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]] if rows != "one length" else [[5, 6, 7], [10, 11, 12]]
    steps = torch.tensor([[t, t + 1, t + 2, t + 3] for t in (20, 30)])

    def decode_steps(adapter=adapter) -> torch.Tensor:
        adapters = [None, "chat"] if adapter == "per row" else [adapter] * 2
        if rows == "different lengths":
            cache = scheduler_like_cache(model, prompts, steps.shape[1], adapters)
        with active_adapter(adapters):
            if rows != "different lengths":
                width = max(map(len, prompts))
                cache = model.new_cache(2, width + steps.shape[1])
                model(torch.tensor([[0] * (width - len(p)) + p for p in prompts]), cache=cache,
                      attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]))
            return torch.cat([model(steps[:, i:i + 1], cache=cache) for i in range(steps.shape[1])], dim=1)

    base = decode_steps(None)
    answers = []
    one_call = kernels.decode_blocks
    monkeypatch.setattr(kernels, "decode_blocks",  # (lora, mask, result)
                        lambda *args: answers.append((args[2], args[-1], one_call(*args))) or answers[-1][2])
    fused = decode_steps()
    assert len(answers) == steps.shape[1] and all(a is not None for _, _, a in answers)  # every step ran in one call
    per_step = {None: 0, "chat": 12, "per row": 12}[adapter]  # 3 blocks x 4 projections, each targeted
    assert all(len(lora) == per_step for lora, _, _ in answers)
    # Only padding needs a mask: rows at different lengths attend their slots up to their own.
    assert all((mask is not None) == (rows == "left-padded") for _, mask, _ in answers)
    monkeypatch.setattr(GPT2, "one_call_params", lambda self, h: None)
    assert torch.equal(fused, decode_steps())
    assert len(answers) == steps.shape[1]
    if adapter is not None:  # the adapter changed its rows' logits, and only theirs
        assert not torch.equal(fused[1], base[1])
        assert torch.equal(fused[0], base[0]) == (adapter == "per row")


def run_with_timeout(target, seconds: float = 60):
    """target() in a daemon thread; fails the test if it has not returned in time (a team of
    threads stuck at its barrier would otherwise hang the test run)."""
    outcome = {}

    def run():
        try:
            outcome["result"] = target()
        except Exception as error:  # raised again here, in the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


@torch.inference_mode()
def test_a_decode_step_runs_alike_in_any_thread_and_fails_cleanly_inside_its_threads(monkeypatch):
    """decode_blocks runs a step's blocks in one OpenMP region whose threads meet at a barrier of
    their own. Steps in two other threads at once give the main thread's bits. A PyTorch call
    that fails inside the region (a float64 LayerNorm weight or bias, which only layer_norm
    refuses), at every LayerNorm of every block and with more threads than this machine may have
    cores, raises here with no thread left waiting, and the next step gives the same bits."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=3, n_head=2)).eval()
    one_call = kernels.decode_blocks
    answers = []
    monkeypatch.setattr(kernels, "decode_blocks", lambda *args: answers.append(one_call(*args)) or answers[-1])

    def decode_steps(first: int) -> torch.Tensor:
        with torch.inference_mode():
            cache = model.new_cache(2, 12)
            model(torch.tensor([[1, 2, 3], [4, 5, 6]]) + first, cache=cache)
            return torch.cat([model(torch.tensor([[t], [t + 1]]), cache=cache) for t in range(first, first + 8)], dim=1)

    in_main = [decode_steps(first) for first in (10, 30)]

    def in_two_threads_at_once():
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(decode_steps, (10, 30)))

    in_threads = run_with_timeout(in_two_threads_at_once)
    assert len(answers) == 32 and all(a is not None for a in answers)  # every step in one call
    assert all(torch.equal(a, b) for a, b in zip(in_threads, in_main))

    cache = model.new_cache(1, 8)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    h = torch.randn(1, 1, 64)
    cache.advance(None, 1, 1)
    params, lora = model.one_call_params(h)
    slots, end = cache.last_slots(1)

    def step(params):
        with torch.inference_mode():
            return one_call(h, params, lora, 1e-5, 2, cache.keys, cache.values, slots, end, None)

    expected = step(params)
    threads = torch.get_num_threads()
    try:
        for n_threads in (2, 3):
            torch.set_num_threads(n_threads)
            for index in (16 * block + k for block in range(3) for k in (0, 1, 8, 9)):  # ln_1, ln_2: weight, bias
                broken = list(params)
                broken[index] = params[index].double()
                with pytest.raises(RuntimeError):
                    run_with_timeout(lambda: step(broken))
                assert torch.equal(run_with_timeout(lambda: step(params)), expected), (n_threads, index)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("in_features, rank, tokens", [(64, 4, 1), (100, 8, 3), (768, 16, 1)])
@torch.inference_mode()
def test_add_lora_adds_the_low_rank_update_in_place(in_features, rank, tokens):
    """add_lora adds (x @ A^T) @ B^T * scale to the listed batch rows (all of them for None), up
    to rounding; a row's result is the same bits alone; what it cannot take, it leaves. The C++
    takes prompts (several tokens a row) too; kernels.add_lora leaves them to PyTorch."""
    torch.manual_seed(0)
    add_lora = kernels.decode_kernels().add_lora
    x, base = torch.randn(5, tokens, in_features), torch.randn(5, tokens, 37)
    a, b, scale = torch.randn(rank, in_features), torch.randn(37, rank), 0.75
    update = (x @ a.t()) @ b.t() * scale
    for rows in (None, torch.tensor([3, 0])):
        out = base.clone()
        assert add_lora(out, x, a, b, scale, rows)
        listed = [0, 3] if rows is not None else range(5)
        expected = base.clone()
        expected[list(listed)] += update[list(listed)]
        assert (out - expected).abs().max() <= 1e-5 * expected.abs().max()
    alone = base[3:4].clone()
    add_lora(alone, x[3:4], a, b, scale, None)
    assert torch.equal(alone[0], out[3])
    out = base.clone()
    assert add_lora(out, x, a, b, scale, torch.tensor([], dtype=torch.long)) and torch.equal(out, base)
    for bad in (dict(a=a.double()), dict(b=b.t().contiguous().t()), dict(rows=torch.tensor([5])),
                dict(rows=torch.tensor([0.0])), dict(x=x[:, :, :-1])):
        args = dict(out=base.clone(), x=x, a=a, b=b, scale=scale, rows=None) | bad
        assert not add_lora(*args.values()) and torch.equal(args["out"], base), bad
    out = base.clone()
    assert kernels.add_lora(out, x, a, b, scale, None) == (tokens == 1)  # a decode step's, not a prompt's
    assert torch.equal(out, base) == (tokens != 1)


@torch.inference_mode()
def test_heads_the_attention_kernel_cannot_take_decode_on_the_modules(monkeypatch):
    """Heads 12 wide (not a multiple of 8): the one call declines before it does anything, and
    the modules decode as they would without it."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=24, n_layer=2, n_head=2)).eval()
    answers = []
    one_call = kernels.decode_blocks
    monkeypatch.setattr(kernels, "decode_blocks", lambda *args: answers.append(one_call(*args)) or answers[-1])

    def decode_steps() -> torch.Tensor:
        cache = model.new_cache(1, 8)
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        return torch.cat([model(torch.tensor([[t]]), cache=cache) for t in (4, 5, 6)], dim=1)

    declined = decode_steps()
    assert answers == [None] * 3
    monkeypatch.setattr(GPT2, "one_call_params", lambda self, h: None)
    assert torch.equal(declined, decode_steps())


def test_hooks_and_gradients_keep_decode_steps_on_the_modules_and_adapters_hand_over_their_updates(tmp_path):
    """The one-call step skips the modules, so it runs only where nothing would miss their calls:
    not under a hook other than an adapter's, not for autograd. An adapter's hook says what it
    would add (nothing while it is off), for the one call to add it the same way."""
    from model.adapters import ACTIVE, active_adapter, load_adapter

    from .conftest import make_lora_adapter

    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2)).eval()
    load_adapter(model, make_lora_adapter(model, tmp_path / "chat", targets=("c_attn", "c_fc")), "chat")
    h = torch.zeros(2, 1, 64)
    with torch.no_grad():
        assert model.one_call_params(h)[1] == []
        a, b, scale = model.lora_adapters["chat"]["transformer.h.1.mlp.c_fc"]
        with active_adapter("chat"):
            params, lora = model.one_call_params(h)
            assert [(k, rows) for k, rows, *_ in lora] == [(0, None), (2, None), (4, None), (6, None)]
            assert lora[-1][2] is a and lora[-1][3] is b and lora[-1][4] == scale
        with active_adapter([None, "chat"]):
            assert [rows.tolist() for _, rows, *_ in model.one_call_params(h)[1]] == [[1]] * 4

        def step(active) -> torch.Tensor:
            cache = model.new_cache(2, 3)
            model(torch.tensor([[1, 2], [3, 4]]), cache=cache)
            token = ACTIVE.set(active)
            try:
                assert model.one_call_params(h) is not None
                return model(torch.tensor([[5], [6]]), cache=cache)
            finally:
                ACTIVE.reset(token)
        no_rows = {"chat": torch.tensor([], dtype=torch.long)}
        token = ACTIVE.set(no_rows)
        assert [rows.numel() for _, rows, *_ in model.one_call_params(h)[1]] == [0] * 4
        ACTIVE.reset(token)
        assert torch.equal(step(no_rows), step(None))  # an empty row list adds nothing (not "all rows")
        assert model.one_call_params(h.double()) is None
        assert model.one_call_params(torch.zeros(kernels.KERNEL_ROWS + 1, 1, 64)) is None
        seen = []
        handle = model.transformer.h[1].mlp.register_forward_hook(lambda *args: seen.append(1))
        assert model.one_call_params(h) is None
        cache = model.new_cache(1, 4)
        model(torch.tensor([[1, 2]]), cache=cache)
        model(torch.tensor([[3]]), cache=cache)
        assert len(seen) == 2  # the prompt's call and the step's
        handle.remove()
        assert model.one_call_params(h) is not None
    assert model.one_call_params(h) is None  # gradients on


@torch.no_grad()
def test_modules_of_other_kinds_keep_decode_steps_on_the_modules():
    """The one call computes what gpt2.py's modules compute; a block holding anything else
    (PyTorch's own Linear, which runs on MKL; a forward replaced on one module) runs as it is."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2)).eval()
    h = torch.zeros(1, 1, 64)
    assert model.one_call_params(h) is not None
    mlp = model.transformer.h[1].mlp
    own = mlp.c_fc
    mlp.c_fc = torch.nn.Linear(64, 256)
    mlp.c_fc.load_state_dict(own.state_dict())
    assert model.one_call_params(h) is None
    mlp.c_fc = own
    model.transformer.h[0].ln_2.forward = lambda x: x
    assert model.one_call_params(h) is None
    del model.transformer.h[0].ln_2.forward
    assert model.one_call_params(h) is not None


def test_the_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("STUDIO_DECODE_KERNELS", "0")
    assert kernels._build() is None


def test_training_and_long_prompts_never_build_the_kernels():
    """They are built only for calls they would take: a training run must not wait a minute for
    them. A fresh interpreter, since this one has built them already."""
    code = """
import torch
from model import GPT2, GPT2Config, kernels
model = GPT2(GPT2Config(vocab_size=64, n_positions=1024, n_embd=32, n_layer=1, n_head=2))
ids = torch.randint(0, 64, (2, kernels.KERNEL_ROWS // 2 + 1))
model(ids).sum().backward()  # gradients
with torch.no_grad():
    model(ids)  # more rows than the kernels take: long prompts
assert kernels._compiled == [], kernels._compiled
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_avx2_build_passes_these_tests_too():
    """The kernels come in two builds, AVX2 and AVX-512 (kernels.WIDE). PyTorch can be told to
    stop at AVX2, so on a CPU with AVX-512 the narrower build is tested as well: this file's tests
    and the scheduler's, in a fresh interpreter that builds and runs it (on a CPU without AVX-512
    this repeats what the rest of the run tests, on the same build)."""
    code = """
import sys, pytest
from model import kernels
assert not kernels.WIDE and kernels.KERNEL_ROWS == 48
built = kernels.decode_kernels()  # None on a CPU without AVX2: the tests then check PyTorch's path
assert built is None or built.__name__ == "studio_decode_kernels", built
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_kernels.py", "tests/test_speed.py",
                      "-k", "not avx2_build"]))
"""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout

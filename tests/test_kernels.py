"""The decode kernels (engine/kernels.py): built where they can be, equal to PyTorch's products and
attention up to rounding, the same for a row alone or in a batch, and out of the way of
gradients and large calls."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from engine.cache import new_cache
from engine.kernels import KernelAttention, KernelLinear
from engine.quantize import GROUP, Int8Linear, rows_in_8_bits
from model import GPT2, GPT2Config, gpt2

from .conftest import REPO

pytestmark = pytest.mark.slow  # the decode kernels, built first

# (kind, in_features, out_features). fp32: in_features 100 and 120 leave tails after the last
# full step (8 or 16 wide, AVX2 or AVX-512), and 37 outputs a part of a pass's weight rows. int8
# (packed, so in_features a multiple of a group of 64): 5, 37 and 300 outputs leave channels past
# the last block of 16. 768 is GPT-2's width.
SHAPES = [("fp32", 100, 37), ("fp32", 120, 37), ("fp32", 768, 300), ("int8", 64, 37), ("int8", 128, 5),
          ("int8", 768, 300)]


def test_the_kernels_are_built_on_an_avx2_cpu():
    """Where the CPU has AVX2 (this machine and CI), a failed build must not pass unnoticed as a
    slow fallback."""
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert kernels.decode_kernels() is not None
        assert kernels.decode_path().startswith("decode kernels")
    else:
        assert kernels.decode_kernels() is None


def layer(kind: str, in_features: int, out_features: int, bias: bool) -> torch.nn.Module:
    torch.manual_seed(in_features + out_features + bias)
    fp32 = KernelLinear(in_features, out_features, bias=bias)
    if bias:
        torch.nn.init.normal_(fp32.bias)  # not the zeros of a fresh layer: the bias must show
    return fp32 if kind == "fp32" else kernels.install(Int8Linear(fp32.weight, fp32.bias))  # packed for the kernel


def pytorch_product(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's product in plain PyTorch: int8's with its inputs rounded to 8 bits as the kernel rounds them."""
    if isinstance(module, Int8Linear):
        y = F.linear(rows_in_8_bits(x), module.rows().float()) * module.scale
        return y if module.bias is None else y + module.bias
    return F.linear(x, module.weight, module.bias)


@pytest.mark.parametrize("kind,in_features,out_features", SHAPES)
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


# fp32: 40, 100, 120 leave tails past the last full step of either width; 768: no tail. int8: one,
# three and twelve groups.
@pytest.mark.parametrize("kind,in_features", [("fp32", 40), ("fp32", 100), ("fp32", 120), ("fp32", 768),
                                              ("int8", 64), ("int8", 192), ("int8", 768)])
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
    unpacked = layer("int8", 100, 37, bias=True)  # groups of 64 do not divide its inputs: not packed
    x = torch.randn(2, 100)
    assert not unpacked.packed and kernels.linear(x, unpacked.weight, unpacked.bias, unpacked.scale) is None
    assert torch.equal(unpacked(x), pytorch_product(unpacked, x))
    row_by_row = Int8Linear(weight, bias)  # never packed (kernels.install packs): the kernels cannot read it
    assert kernels.linear(torch.randn(2, 768), row_by_row.weight, bias, row_by_row.scale) is None
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # a shape mismatch is PyTorch's to name
        KernelLinear(768, 300)(torch.randn(2, 700))


@torch.no_grad()
def test_int8_prompts_of_any_length_take_the_kernel():
    """Past KERNEL_ROWS rows an int8 product stays on the kernel (up to several times PyTorch's
    speed, which widens every weight to float), and a row keeps its bits."""
    module = layer("int8", 128, 37, bias=True)
    x = torch.randn(kernels.KERNEL_ROWS + 30, 128)
    got = kernels.linear(x, module.weight, module.bias, module.scale)
    assert got is not None and (got - pytorch_product(module, x)).abs().max() <= 1e-5 * got.abs().max()
    assert torch.equal(got, torch.cat([module(x[row:row + 1]) for row in range(len(x))]))


def test_gradients_go_through_pytorch():
    module = KernelLinear(64, 8)
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
    model = kernels.install(GPT2(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2)).eval())
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]] if not padded else [[5, 6, 7, 8], [9, 10]]
    tokens = torch.tensor([[t, t + 1, t + 2] for t in (20, 30)])

    def decode_steps() -> torch.Tensor:
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        real = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        cache = new_cache(model, 2, width + tokens.shape[1])
        model(ids, attention_mask=real, cache=cache)
        assert cache.has_padding == padded
        return torch.cat([model(tokens[:, i:i + 1], cache=cache) for i in range(tokens.shape[1])], dim=1)

    pytorch_calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(gpt2.F, "scaled_dot_product_attention", lambda *a, **kw: pytorch_calls.append(1) or sdpa(*a, **kw))
    with_kernel = decode_steps()
    prefill_calls = model.config.n_layer
    assert len(pytorch_calls) == prefill_calls  # the prompt's; none for the steps
    with kernels.switched_off():
        expected = decode_steps()
    assert len(pytorch_calls) == 2 * prefill_calls + tokens.numel() // 2 * model.config.n_layer
    assert (with_kernel - expected).abs().max() <= 1e-5 * expected.abs().max()


@torch.no_grad()
def test_install_puts_the_kernels_onto_a_model_from_outside_and_changes_nothing_else(tiny_checkpoint):
    """The model's modules become their kernel subclasses (the same objects: parameters, state
    dict and adapters' hooks stay), the weights keep their values, the head stays tied, and the
    logits stay PyTorch's up to rounding; switched off, they are the plain model's exactly."""
    from model import load_pretrained

    plain, _ = load_pretrained(tiny_checkpoint)
    model, _ = load_pretrained(tiny_checkpoint)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attention = model.transformer.h[0].attn
    assert kernels.install(model) is model and model.transformer.h[0].attn is attention
    assert isinstance(attention, KernelAttention) and isinstance(attention.c_attn, KernelLinear)
    assert isinstance(model.lm_head, KernelLinear)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    ids = torch.randint(0, model.config.vocab_size, (2, 1), generator=torch.Generator().manual_seed(0))
    cache, plain_cache = new_cache(model, 2, 4), new_cache(plain, 2, 4)
    fast, expected = model(ids, cache=cache), plain(ids, cache=plain_cache)
    assert (fast - expected).abs().max() <= 1e-5 * expected.abs().max()
    with kernels.switched_off():
        assert torch.equal(model(ids), plain(ids))


def test_the_kernels_can_be_turned_off():
    """STUDIO_DECODE_KERNELS=0 (as where there is no compiler): the build never starts, the model
    decodes on PyTorch, and the status line says so."""
    code = """
import os
os.environ["STUDIO_DECODE_KERNELS"] = "0"
from engine import kernels
assert not kernels.wait_until_built()
assert kernels.decode_path() == "PyTorch (STUDIO_DECODE_KERNELS=0)", kernels.decode_path()
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_build_is_keyed_on_the_source_and_found_again_from_another_folder(tmp_path):
    """A copy of the checkout elsewhere loads the build this one made, without compiling: the
    build is named by the source's content, not by where it lives."""
    copy = tmp_path / "elsewhere"
    shutil.copytree(REPO / "engine", copy / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "model", copy / "model", ignore=shutil.ignore_patterns("__pycache__"))
    _, _, directory = kernels.build_plan()
    built = {path.name: path.stat().st_mtime_ns for path in directory.glob("*.[os]*")}  # kernels.o, the .so
    code = "from engine import kernels; assert kernels.wait_until_built() == (kernels.unavailable_reason() is None)"
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    if kernels.unavailable_reason() is None:
        assert built and {path.name: path.stat().st_mtime_ns for path in directory.glob("*.[os]*")} == built


def test_a_lock_left_by_a_killed_build_does_not_stop_the_next_one():
    """torch's build leaves a lock file behind when its process is killed mid-build, and waits
    for such a file forever; the next start finds it stale and builds (or loads) all the same."""
    if kernels.unavailable_reason() is not None:
        return  # nothing is built here: the PyTorch path has no lock to leave
    _, _, directory = kernels.build_plan()
    (directory / "lock").touch()
    code = "from engine import kernels; print(kernels.wait_until_built(timeout_s=120))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
    assert not (directory / "lock").exists()


# Checks a build's products (fp32 and int8) and attention against PyTorch, and a row's bits alone
# or in a batch, in a fresh interpreter (a process makes one build).
CHECK_A_BUILD = """
import math, torch, torch.nn.functional as F
from engine import kernels
from engine.quantize import Int8Linear, rows_in_8_bits
assert kernels.wait_until_built(), kernels.decode_path()
print(kernels.WIDE, kernels.decode_kernels().int8_dot)
torch.manual_seed(0)
for in_features in (40, 100, 128, 768):
    fp32 = kernels.KernelLinear(in_features, 301)
    for layer in [fp32] + ([kernels.install(Int8Linear(fp32.weight, fp32.bias))] if in_features % 64 == 0 else []):
        x = torch.randn(8, in_features)
        x[3, 0] = math.nan  # a row with a NaN gives NaN; the others stay as they were
        with torch.no_grad():
            got = layer(x)
            scale = getattr(layer, "scale", None)
            rows = x if scale is None else rows_in_8_bits(x)
            weight = layer.weight if scale is None else layer.rows().float() * scale[:, None]
            expected = F.linear(rows, weight, layer.bias)
            assert got[3].isnan().all() and expected[3].isnan().all()
            got[3], expected[3] = 0, 0
            assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
            x[3, 0] = 0
            got = layer(x)
            assert all(torch.equal(layer(x[r:r + 1])[0], got[r]) for r in range(8))
q, k, v = torch.randn(3, 2, 1, 64), torch.randn(3, 2, 30, 64), torch.randn(3, 2, 30, 64)
got, expected = kernels.decode_attention(q, k, v, None), F.scaled_dot_product_attention(q, k, v)
assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
print("checked")
"""


@pytest.mark.parametrize("int8_dot", list(kernels.INT8_DOTS))
def test_each_build_this_cpu_can_run_gives_pytorchs_results_and_a_rows_bits_alone(int8_dot):
    """The kernels come in one build per vector width (AVX2 or AVX-512, kernels.WIDE) and int8
    path (kernels.INT8_DOTS): this machine's, and each other its CPU can run, chosen with
    STUDIO_INT8_DOT; the AVX2 path with PyTorch told to stop at AVX2, so that the narrower fp32
    build is checked too."""
    env = {**os.environ, "STUDIO_INT8_DOT": int8_dot}
    if int8_dot == "AVX2":
        env["ATEN_CPU_CAPABILITY"] = "avx2"
    elif int8_dot not in kernels.int8_dots_here():
        pytest.skip(f"the CPU has no {int8_dot}")
    done = subprocess.run([sys.executable, "-c", CHECK_A_BUILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wide, built_dot, checked = done.stdout.split()[-3:]
    assert (built_dot, checked) == (int8_dot, "checked")
    assert wide == str(int8_dot != "AVX2" and kernels.WIDE)


@torch.no_grad()
def test_the_integer_product_equals_pytorchs_exactly_where_no_float_rounds():
    """Inputs whole numbers with 127 at the top of each group and weights whole numbers with 127 in
    each row: every scale is 1, the 8-bit values are the inputs, and every sum stays exact in
    float, so the kernel's integer product and PyTorch's float one give the same bits (any
    difference is a wrong product or a wrong rounding of an input)."""
    generator = torch.Generator().manual_seed(0)
    in_features = 4 * GROUP
    weight = torch.randint(-127, 128, (70, in_features), generator=generator).float()
    weight[:, 5] = 127
    layer = Int8Linear(weight, torch.nn.Parameter(torch.randint(-50, 50, (70,), generator=generator).float()))
    layer.pack_for_kernels()
    assert torch.equal(layer.scale, torch.ones(70)) and torch.equal(layer.rows().float(), weight)
    x = torch.randint(-127, 128, (6, in_features), generator=generator).float()
    x[:, ::GROUP] = -127  # the top of every group
    assert torch.equal(rows_in_8_bits(x), x)
    got = kernels.linear(x, layer.weight, layer.bias, layer.scale)
    assert got is not None and torch.equal(got, F.linear(x, weight, layer.bias))


@pytest.mark.parametrize("width", [8, 100, 768])
@torch.no_grad()
def test_the_layer_norm_and_gelu_kernels_equal_pytorchs(width):
    norm = torch.nn.LayerNorm(width)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(5, 1, width) * 3 + 1
    got = kernels.layer_norm(x, norm)
    assert got is not None and (got - norm(x)).abs().max() <= 1e-5 * norm(x).abs().max()
    assert torch.equal(torch.cat([kernels.layer_norm(x[r:r + 1], norm) for r in range(5)]), got)  # a row's own
    x = torch.cat([torch.linspace(-12, 12, 4 * width - 3), torch.tensor([math.inf, -0.0, math.nan])])
    got, expected = kernels.gelu(x), F.gelu(x, approximate="tanh")
    assert got is not None and got.shape == x.shape and torch.isnan(got[-1]) and got[-3] == math.inf
    assert (got[:-3] - expected[:-3]).abs().max() <= 1e-6 * 12


def decode_steps(model, hooked: torch.nn.Module | None = None, steps: int = 4) -> tuple[torch.Tensor, int]:
    """The logits of `steps` one-token calls after prompts of different lengths in one cache
    (rows written at different slots, one row left-padded), and how many blocks ran as one call;
    with a hook on `hooked`, its block runs its modules one by one."""
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    cache, short = new_cache(model, 3, 16), new_cache(model, 1, 16)
    padding = torch.ones(3, 6, dtype=torch.long)
    padding[0, :2] = 0
    model(torch.randint(0, vocab, (3, 6), generator=generator), attention_mask=padding, cache=cache)
    model(torch.randint(0, vocab, (1, 3), generator=generator), cache=short)
    cache.copy_row(2, short)  # a request that joined with a shorter prompt: its own slots from here
    taken = []  # per call of the kernels that ran: how many blocks it ran
    blocks_call = kernels.decode_blocks

    def counted(blocks, *args):
        y = blocks_call(blocks, *args)
        if y is not None:
            taken.append(len(blocks))
        return y
    handle = None if hooked is None else hooked.register_forward_hook(lambda module, inputs, output: None)
    try:
        kernels.decode_blocks = counted
        logits = [model(torch.randint(0, vocab, (3, 1), generator=generator), cache=cache) for _ in range(steps)]
    finally:
        kernels.decode_blocks = blocks_call
        if handle is not None:
            handle.remove()
    return torch.cat(logits, dim=1), taken


@pytest.mark.parametrize("quantize", [None, "int8"])
@torch.no_grad()
def test_a_block_in_one_call_gives_its_modules_bits(quantize):
    """A decode step's blocks run in one call of the kernels (decode_blocks); with a hook on a
    block (steering), as one call each; with a hook inside one (patching), that block runs its
    modules one by one. Every way gives the same bits: which way a call goes never changes a
    token, whatever hooks another request has put on meanwhile."""
    from engine import prepare_for_serving
    from engine.steering import Steering, steered

    from model.adapters import active_adapter

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=300, n_positions=32, n_embd=64, n_layer=3, n_head=4)
    plain, model = GPT2(config).eval(), GPT2(config).eval()
    model.load_state_dict(plain.state_dict())
    prepare_for_serving(model, quantize)
    fused, taken = decode_steps(model)
    assert taken == [3] * 4  # every step's blocks in one call
    block_by_block, taken = decode_steps(model, hooked=model.transformer.h[1])
    assert taken == [1] * 3 * 4  # the hook sees block 1's output: one call a block
    one_by_one, taken = decode_steps(model, hooked=model.transformer.h[1].mlp)
    assert taken == [1, 1] * 4  # the hooked block ran its modules
    assert torch.equal(fused, block_by_block) and torch.equal(fused, one_by_one)
    steering = Steering(layer=2, vector=torch.randn(config.n_embd), strength=4.0)
    with steered(model, steering):  # its hooks on every block: one call a block, the addition made
        steered_logits, taken = decode_steps(model)
    assert taken == [1] * 3 * 4 and not torch.equal(steered_logits, fused)
    assert decode_steps(model)[1] == [3] * 4  # unsteered, past the steering's idle hooks
    with active_adapter("summarize"):  # the scheduler's batch may mix adapters: each layer adds its rows' own
        assert decode_steps(model)[1] == []
    with torch.enable_grad():  # autograd records the modules' calls
        assert decode_steps(model)[1] == []
    expected, _ = decode_steps(plain)
    tolerance = 1e-5 if quantize is None else 0.05  # int8: the weights and inputs rounded
    assert (fused - expected).abs().max() <= tolerance * expected.abs().max()


@torch.no_grad()
def test_inputs_too_small_for_a_normal_scale_count_as_zero_on_both_paths():
    """A group whose scale (max|x| / 127) would be subnormal is all 0, on the kernel and in
    rows_in_8_bits alike: x / scale could pass 127 there and wrap round in 8 bits."""
    int8 = layer("int8", 128, 20, bias=False)
    x = torch.randn(2, 128)
    x[0, :GROUP] = torch.randn(GROUP) * 1e-40  # the first group subnormal, the second normal
    assert torch.equal(rows_in_8_bits(x)[0, :GROUP], torch.zeros(GROUP))
    got = kernels.linear(x, int8.weight, int8.bias, int8.scale)
    assert got is not None and (got - pytorch_product(int8, x)).abs().max() <= 1e-5 * got.abs().max()


def test_a_failed_build_of_the_int8_path_falls_back_to_the_next_and_keeps_the_kernels():
    """A compiler that cannot take the best int8 path's flags (one too old for AMX, say) costs
    only that path: the build is made again with the next one the CPU has."""
    here = kernels.int8_dots_here()
    better = [dot for dot in here if dot != "AVX2"]
    if not better:
        pytest.skip("the CPU has no int8 path but AVX2's")
    next_one = here[here.index(better[0]) + 1]
    code = f"""
from engine import kernels
kernels.INT8_DOTS[{better[0]!r}] = (kernels.INT8_DOTS[{better[0]!r}][0], ["-mno-such-instructions"])
assert kernels.wait_until_built(), kernels.decode_path()
print(kernels.INT8_DOT, kernels.decode_kernels().int8_dot, kernels.decode_path())
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "STUDIO_INT8_DOT": better[0]},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.split()[:2] == [next_one, next_one] and f"int8 on {next_one}" in done.stdout


@pytest.mark.parametrize("width", [1, 7, 8, 9, 50257])
def test_the_argmax_kernel_picks_torchs_index_first_of_ties_and_nan_the_largest(width):
    """A greedy step's token (engine/generate.py): the same index as torch.argmax, for widths
    around and past the kernel's vectors of 8."""
    generator = torch.Generator().manual_seed(width)
    scores = torch.randn(3, width, generator=generator)
    cases = [scores.clone()]
    scores[:, width // 2] = scores.max() + 1
    scores[:, -1] = scores[:, width // 2]  # tied with an earlier one: the first wins
    cases.append(scores.clone())
    scores[1, -1] = math.nan  # the largest, wherever it is
    cases += [scores, torch.full((2, width), -math.inf)]
    for case in cases:
        assert torch.equal(kernels.argmax(case), case.argmax(dim=-1, keepdim=True))
    assert kernels.argmax(torch.randn(2, width, dtype=torch.float64)) is None  # PyTorch's to take


def test_int8_weights_stay_row_by_row_where_the_kernels_cannot_run(monkeypatch):
    """Packed weights cost PyTorch's product an unpacking at every call: install packs them only
    where the kernels will run."""
    assert kernels.wait_until_built()  # this process's kernels stay as they are
    monkeypatch.setenv("STUDIO_DECODE_KERNELS", "0")
    assert not kernels.install(Int8Linear(torch.randn(20, 128), None)).packed
    monkeypatch.delenv("STUDIO_DECODE_KERNELS")
    assert kernels.install(Int8Linear(torch.randn(20, 128), None)).packed


@torch.no_grad()
def test_the_state_dict_is_row_by_row_whether_or_not_the_kernels_packed_the_weights():
    """A model the kernels are on (packed int8 weights) saves and loads the same state dict as one
    they are not on, so a checkpoint never depends on the CPU; int8 layers made after the kernels
    are put on are packed too."""
    from engine.quantize import quantize_weights

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=300, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    plain = quantize_weights(GPT2(config).eval())
    installed = kernels.install(quantize_weights(GPT2(config).eval()))  # other weights, replaced below
    assert installed.lm_head.packed and installed.transformer.h[0].attn.c_attn.packed
    installed.load_state_dict(plain.state_dict())  # row by row, into packed layers
    saved = installed.state_dict()
    for key, value in plain.state_dict().items():
        assert saved[key].dtype == value.dtype and torch.equal(saved[key], value), key
    fresh = quantize_weights(GPT2(config).eval())
    fresh.load_state_dict(saved)
    ids = torch.randint(0, 300, (1, 8))
    assert torch.equal(fresh(ids), plain(ids))  # both on PyTorch's path, the same weights
    later = kernels.install(GPT2(config).eval())
    quantize_weights(later)  # after the kernels are on
    assert later.lm_head.packed


def test_a_failed_build_leaves_the_int8_weights_row_by_row_for_pytorch():
    """Where no build succeeds, the weights install packed are unpacked again: PyTorch's product
    would otherwise unpack them at every call."""
    code = """
import torch
from engine import kernels
from engine.quantize import Int8Linear
for name, (flag, _) in list(kernels.INT8_DOTS.items()):
    kernels.INT8_DOTS[name] = (flag, ["-mno-such-instructions"])
layer = kernels.install(Int8Linear(torch.randn(20, 128), None))
print(layer.packed, kernels.wait_until_built(), layer.packed)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["True", "False", "False"]

"""The decode kernels: matrix products for a few rows (fp32 or int8 weights), attention for one
new token per row, and a decode step's blocks in one call, on an x86 CPU, put onto a loaded
model from outside (`install`).

Decoding one token multiplies one row per sequence by every weight matrix, so its speed is how
fast the weights stream from memory. `kernels.cpp` reads them about twice as fast as PyTorch's
own product for a few rows (dot products of contiguous weight rows, several input rows sharing
each read). int8 weights are multiplied by the input rows rounded to 8 bits, in the CPU's integer
dot-product instructions (INT8_DOT: the best of AMX, AVX512-VNNI, AVX-VNNI and AVX2 this CPU
has), so they stream at the speed of their quarter of the bytes, and int8 prompts run on them too
(docs/performance.md has the measured tables). The attention kernel does what
scaled_dot_product_attention does for a query of one token.

Each input row is summed in the same order whatever the number of rows, and a row's attention
whatever the other rows' lengths, so a request decodes to bit-identical results alone or in a
batch of other users' requests (engine/scheduler.py).

The C++ is compiled by torch.utils.cpp_extension in a background thread, started by `install`,
so it never stands between launch and the first answer: until it is ready (10 to 20 seconds the
first time: only the headers it needs, and only the instructions this CPU has), and wherever it
cannot be (no AVX2, as on ARM; no C++ compiler; STUDIO_DECODE_KERNELS=0), every call runs on
PyTorch's products and attention, with the same results up to rounding. The build is keyed on
the source's content and its compiler flags, so a moved checkout finds it in the cache
(~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import itertools
import logging
import mmap
import os
import shutil
import threading
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.adapters import ACTIVE as ACTIVE_ADAPTER
from model.gpt2 import GPT2, MLP, Attention, Block

from .steering import ACTIVE as STEERING


def cpu_info(field: str) -> str:
    """A field of the first CPU in /proc/cpuinfo ("vendor_id", "flags"); "" where unknown."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.split(":")[0].strip() == field), "")
    except OSError:
        return ""


def cpu_vendor() -> str:
    """The CPU's vendor as Linux names it ("AuthenticAMD", "GenuineIntel"); "" where unknown."""
    return cpu_info("vendor_id")


# The CPU's widest vectors, as PyTorch found them (ATEN_CPU_CAPABILITY=avx2 makes an AVX-512 CPU
# build and run the AVX2 kernels).
CAPABILITY = torch.backends.cpu.get_cpu_capability()
WIDE = CAPABILITY == "AVX512"
# Calls over more rows than this go to PyTorch's product. With AVX2, MKL is faster past about 48
# rows; on AMD CPUs with AVX-512 the kernels stay ahead up to a whole prompt chunk, since MKL runs
# a generic code path there. On Intel MKL takes its tuned path, so prompts stay with it.
KERNEL_ROWS = 512 if WIDE and cpu_vendor() == "AuthenticAMD" else 48
# The integer dot products int8 weights can take (kernels.cpp), best first: the CPU flag each
# needs, as Linux lists it, and the compiler flag that lets the build use it. AMX multiplies the
# calls of more than 4 rows (prompts, large batches) on its tiles, and fewer (a decode step's)
# with AVX512-VNNI, which every CPU with AMX has. Those two only in the AVX-512 build.
INT8_DOTS = {"AMX": ("amx_int8", ["-mavx512vnni", "-mamx-tile", "-mamx-int8"]),
             "AVX512-VNNI": ("avx512_vnni", ["-mavx512vnni"]), "AVX-VNNI": ("avx_vnni", ["-mavxvnni"]),
             "AVX2": ("avx2", [])}
WIDE_ONLY = ("AMX", "AVX512-VNNI")


def int8_dots_here() -> list[str]:
    """The int8 paths this CPU and build can run, best first."""
    flags = set(cpu_info("flags").split())
    return [name for name, (flag, _) in INT8_DOTS.items()
            if flag in flags and (WIDE or name not in WIDE_ONLY) and (name != "AMX" or tiles_allowed())]


@functools.cache
def tiles_allowed() -> bool:
    """Whether Linux lets this process use AMX's tiles. Asked as kernels.cpp asks (arch_prctl's
    ARCH_REQ_XCOMP_PERM for XTILEDATA; the answer holds for the whole process), so that a refusal
    (a kernel before 5.16) costs no AMX build."""
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0  # 158: SYS_arch_prctl on x86-64
    except (OSError, AttributeError):
        return False


def pick_int8_dot() -> str:
    """The best int8 path here, or the one STUDIO_INT8_DOT names where this CPU can run it (the
    tests build each path a CPU has; a side-by-side run can take a lesser one)."""
    here = int8_dots_here() or ["AVX2"]
    asked = os.environ.get("STUDIO_INT8_DOT")
    if asked is not None and asked not in here:
        warnings.warn(f"STUDIO_INT8_DOT={asked} is not a path this CPU can run ({', '.join(here)}): taking {here[0]}")
    return asked if asked in here else here[0]


INT8_DOT = pick_int8_dot()
SOURCE = Path(__file__).with_name("kernels.cpp")

log = logging.getLogger(__name__)
_lock = threading.Lock()
_build: threading.Thread | None = None
_built = threading.Event()  # set once the build has succeeded or failed
_module = None  # the compiled module, once built
_why_not: tuple[str, str] = ("none", "")  # why there is none (WHY_NOT's key, detail), once the build has given up
_switched_off = 0  # blocks of `switched_off()` open: PyTorch's path, for side-by-side measurements
# Why decoding is on PyTorch's path, by key, in the log's words; serve/messages.py says each in
# the page's language. {detail}: the CPU's capability, or the failed build's error.
WHY_NOT = {"building": "decode kernels building", "switched_off": "kernels switched off", "none": "no kernels",
           "env_off": "STUDIO_DECODE_KERNELS=0", "no_avx2": "the CPU has no AVX2 ({detail})",
           "no_compiler": "no C++ compiler", "build_failed": "the build failed ({detail})"}


@dataclass(frozen=True)
class DecodePath:
    """Which path decodes: the kernels (`why` empty), or PyTorch's and why (WHY_NOT's key)."""
    why: str = ""
    detail: str = ""

    def __str__(self) -> str:
        if not self.why:
            return f"decode kernels ({CAPABILITY}, int8 on {INT8_DOT})"
        return f"PyTorch ({WHY_NOT[self.why].format(detail=self.detail)})"


BUILDING = str(DecodePath("building"))  # the decode path until the build has ended


def unavailable() -> tuple[str, str] | None:
    """Why the kernels can never run here (WHY_NOT's key, detail), or None where they can be built."""
    if os.environ.get("STUDIO_DECODE_KERNELS", "1") == "0":
        return "env_off", ""
    if CAPABILITY not in ("AVX2", "AVX512"):
        return "no_avx2", CAPABILITY
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no_compiler", ""
    return None


def unavailable_reason() -> str | None:
    """Why the kernels can never run here, in words, or None where they can be built."""
    why = unavailable()
    return None if why is None else WHY_NOT[why[0]].format(detail=why[1])


def start_build() -> None:
    """Build (or find in the cache) the kernels in a background thread, once per process."""
    global _build, _why_not
    with _lock:
        if _build is not None or _built.is_set():
            return
        why = unavailable()
        if why is not None:
            _why_not = why
            log.info("decode kernels unavailable (%s): decoding runs on PyTorch", unavailable_reason())
            _built.set()
            return
        _build = threading.Thread(target=_compile, name="decode-kernels-build", daemon=True)
        _build.start()


def build_plan(int8_dot: str | None = None) -> tuple[bytes, list[str], Path]:
    """The source, the compiler flags (for INT8_DOT, or the int8 path named), and the build
    folder, which is named by both: the build does not depend on where the checkout lives, and
    one already made is loaded, not compiled."""
    source = SOURCE.read_bytes()
    # -ffp-contract=off: the same rounding in every template copy (the FMAs meant are intrinsics).
    flags = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off"]
    if WIDE:
        flags += ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"]
    flags += INT8_DOTS[int8_dot or INT8_DOT][1]  # only the instructions this CPU has: nothing else is compiled
    key = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    return source, flags, root / f"studio_decode_kernels_{key}"


def _compile() -> None:
    """Build with INT8_DOT's instructions; where that fails (a compiler too old for AMX, say),
    with each lesser path's in turn down to AVX2's, so that the rest is not lost with them."""
    global INT8_DOT, _module, _why_not
    here = int8_dots_here()
    lesser = here[here.index(INT8_DOT) + 1:] if INT8_DOT in here else []
    try:
        for int8_dot in dict.fromkeys([INT8_DOT, *lesser, "AVX2"]):
            try:
                module = build_with(int8_dot)
                INT8_DOT = int8_dot  # first: the decode path names it once the module is there
                _module = module
                log.info("decode kernels ready (int8 on %s): decoding runs on them from now on", INT8_DOT)
                return
            except Exception as error:  # a missing compiler or ninja: slower, not broken
                _why_not = ("build_failed", type(error).__name__)
                log.warning("decode kernels with int8 on %s: the build failed: %s", int8_dot, error)
        log.warning("decode kernels unavailable, decoding stays on PyTorch")
        for layer in list(_packed_layers):  # PyTorch's product reads them row by row
            layer.unpack_for_pytorch()
        warnings.warn(f"the decode kernels could not be built, so decoding runs on PyTorch's products and attention "
                      f"(slower; results the same up to rounding): {_why_not[1]}")
    finally:
        _built.set()


def build_with(int8_dot: str):
    """The kernels built (or found in the cache) with int8_dot's instructions; raises where they cannot be."""
    from torch.utils.cpp_extension import load  # slow to import: only here
    source, flags, directory = build_plan(int8_dot)
    root, name = directory.parent, directory.name
    directory.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.building", "w") as building:
        # One process builds at a time. torch's own lock file inside the folder outlives a
        # process killed mid-build, and torch would wait for it forever: holding this lock, no
        # one else is building, so such a file is stale.
        fcntl.flock(building, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        copy = directory / "kernels.cpp"
        if not copy.is_file() or copy.read_bytes() != source:
            staged = directory / "kernels.cpp.new"
            staged.write_bytes(source)
            staged.replace(copy)
        log.info("building the decode kernels in the background (10 to 20 seconds the first time)")
        module = load(name, [str(copy)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                      build_directory=str(directory))
    if module.int8_dot != int8_dot:  # the flags did not give the path asked for: say so, not a slow surprise
        raise RuntimeError(f"the build took the {module.int8_dot} int8 path, not {int8_dot}")
    return module


def wait_until_built(timeout_s: float | None = 600) -> bool:
    """Start the build if needed and wait for it (at most timeout_s); whether the kernels are ready."""
    start_build()
    if _built.wait(timeout_s) and _build is not None:
        _build.join(timeout_s)  # its thread has ended too: a caller counting threads sees it gone
    return _module is not None


def settled() -> bool:
    """Whether the build has ended (ready, failed or never possible): the path will not change."""
    return _built.is_set()


def decode_kernels():
    """The compiled module if it is ready (never waits for it), else None."""
    return None if _switched_off else _module


def current_path() -> DecodePath:
    """Which path decodes now."""
    if _module is not None and not _switched_off:
        return DecodePath()
    if _switched_off:
        return DecodePath("switched_off")
    if _built.is_set():
        return DecodePath(*_why_not)
    return DecodePath("building")


def decode_path() -> str:
    """Which path decodes now, in words, for the log, the benchmarks and the API's header."""
    return str(current_path())


@contextmanager
def switched_off():
    """Run on PyTorch's path inside the block: the benchmark's 'kernels off' side."""
    global _switched_off
    _switched_off += 1
    try:
        yield
    finally:
        _switched_off -= 1


def recorded(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record a call on these tensors: then it is PyTorch's to run."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def for_few_rows(x: torch.Tensor, width: int, *parameters: torch.Tensor | None,
                 most_rows: int | None = KERNEL_ROWS):
    """The compiled module where a call over x is the kernels' to take (CPU inputs, at most
    `most_rows` rows of `width` (None: any number), nothing for autograd to record), else None."""
    kernels = decode_kernels()
    if (kernels is None or not x.is_cpu or (most_rows is not None and x.numel() > most_rows * width)
            or recorded(x, *parameters)):
        return None
    return kernels


def seen_slots(mask: torch.Tensor | None) -> torch.Tensor | bool | None:
    """The (rows, slots) mask the kernels take, from the model's (rows, 1, 1, slots): None for
    none, False for a mask they do not take (one per head, or one broadcast over the rows)."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        return False
    return mask[:, 0, 0]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           scale: torch.Tensor | None = None) -> torch.Tensor | None:
    """x @ weight.T, times `scale` per output channel (int8 weights, packed as uint8 by
    quantize.pack), plus bias; or None when the caller should use PyTorch's product.

    Here: what the kernels are for (CPU inputs, at most KERNEL_ROWS rows for fp32 weights and any
    number for int8 ones, whose prompts the kernel multiplies faster than PyTorch, which widens
    each weight to float first; nothing for autograd to record). kernels.cpp: what they can take
    (dtypes, memory order, shapes; a mismatch is PyTorch's to name)."""
    most_rows = None if scale is not None else KERNEL_ROWS
    kernels = for_few_rows(x, weight.shape[-1], weight, bias, most_rows=most_rows)
    return None if kernels is None else kernels.linear(x, weight, bias, scale)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(dim), masked) v for one query token per row, or None when the caller
    should use PyTorch's attention.

    q (rows, heads, 1, dim); keys and values (rows, heads, slots, dim), views of the KV cache;
    mask None or (rows, 1, 1, slots), True where the query may look."""
    kernels, seen = decode_kernels(), seen_slots(mask)
    if kernels is None or q.shape[2] != 1 or not q.is_cpu or recorded(q, keys, values) or seen is False:
        return None
    return kernels.decode_attention(q, keys, values, seen)


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor | None:
    """norm(x) for a few rows, or None when the caller should use PyTorch's."""
    kernels = for_few_rows(x, x.shape[-1], norm.weight, norm.bias)
    return None if kernels is None else kernels.layer_norm(x, norm.weight, norm.bias, norm.eps)


def gelu(x: torch.Tensor) -> torch.Tensor | None:
    """GPT-2's GELU (the tanh form) of a few rows, or None when the caller should use PyTorch's."""
    kernels = for_few_rows(x, x.shape[-1])
    return None if kernels is None else kernels.gelu(x)


def argmax(scores: torch.Tensor) -> torch.Tensor | None:
    """scores.argmax(dim=-1, keepdim=True) of (rows, vocabulary) scores on the CPU (the same index:
    the first of ties, a NaN the largest), or None when the caller should use PyTorch's."""
    kernels = decode_kernels()
    return None if kernels is None or not scores.is_cpu else kernels.argmax(scores)


def decode_blocks(blocks: list[Block], h: torch.Tensor, mask: torch.Tensor | None, cache,
                  first_layer: int) -> torch.Tensor | None:
    """The blocks in turn (layers first_layer...) on h, for one new token per row, in one call of
    the kernels; or None when the caller should run each block's modules. The result is the same
    bits either way (kernels.cpp, decode_blocks), so which way a call goes never changes a token.

    Taken where the modules would all take the kernels (pre-LN blocks on the CPU, a few rows of
    one token each, a KV cache, nothing for autograd to record) and nothing needs to see inside
    a block: no adapter on (the scheduler's batch may mix them), no hook on its modules (the
    activation patching reads and replaces attention and MLP outputs). Hooks on a block itself,
    steering's and the residual stream's, are its caller's to keep (KernelBlock, KernelGPT2)."""
    kernels, seen = decode_kernels(), seen_slots(mask)
    if (kernels is None or not blocks or cache is None or h.dim() != 3 or h.shape[1] != 1
            or h.shape[0] > KERNEL_ROWS or not h.is_cpu or torch.is_grad_enabled() or ACTIVE_ADAPTER.get() is not None
            or seen is False or not hasattr(cache, "one_token_slots")
            or any(not block.pre_norm or watched(block) for block in blocks)):
        return None
    slots, end = cache.one_token_slots()
    parameters, eps = [], []
    for block in blocks:
        ln_1, attention, ln_2, mlp = (block._modules[name] for name in ("ln_1", "attn", "ln_2", "mlp"))
        # Read from the modules' own dictionaries at each call (nn.Module's attribute lookup costs
        # a tenth of this function), never kept: a parameter or buffer can be replaced (.to(), say).
        parameters += [*norm_parameters(ln_1), *linear_parameters(attention._modules["c_attn"]),
                       *linear_parameters(attention._modules["c_proj"]), *norm_parameters(ln_2),
                       *linear_parameters(mlp._modules["c_fc"]), *linear_parameters(mlp._modules["c_proj"])]
        eps += [ln_1.eps, ln_2.eps]
    layers = range(first_layer, first_layer + len(blocks))
    return kernels.decode_blocks(h, parameters, eps, blocks[0]._modules["attn"].n_head,
                                 [cache.keys[i] for i in layers], [cache.values[i] for i in layers], slots, end, seen)


def hooked(block: Block) -> bool:
    """Whether a hook sees the block's input or output: the residual stream's trace, or steering's
    where the call is steered (unsteered, its hooks add nothing: engine/steering.py)."""
    steering = block.__dict__.get("steering_hooks", ())
    others = any(key not in steering for key in (*block._forward_hooks, *block._forward_pre_hooks))
    return others or (bool(steering) and STEERING.get() is not None)


def norm_parameters(norm: nn.Module) -> tuple:
    return norm._parameters["weight"], norm._parameters["bias"]


def linear_parameters(layer: nn.Module) -> tuple:
    """(weight, bias, scale) of a kernel Linear or an Int8Linear (scale None for fp32)."""
    return layer._parameters["weight"], layer._parameters.get("bias"), layer._buffers.get("scale")


def watched(block: Block) -> bool:
    """Whether a hook would see inside the block: one on any of its modules other than LoRA's
    (which adds nothing with no adapter on), or one for every module."""
    inside = block.__dict__.get("_inside")
    if inside is None:  # its modules, listed once (modules_changed forgets the list)
        inside = block.__dict__["_inside"] = list(block.modules())[1:]
    for module in inside:
        # From __dict__: getattr on a module without the flag raises inside nn.Module, 5 us a block.
        if module._forward_pre_hooks or len(module._forward_hooks) > module.__dict__.get("has_lora_hook", False):
            return True
    return bool(torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)


def modules_changed(model: nn.Module) -> None:
    """Say that modules of `model` were replaced (quantize_weights): watched() lists them again,
    and new int8 layers of a model the kernels are on are packed for them."""
    for module in model.modules():
        module.__dict__.pop("_inside", None)
    if model.__dict__.get("kernels_installed"):
        pack_int8_layers(model)


_packed_layers: weakref.WeakSet = weakref.WeakSet()  # unpacked again if the build fails


def pack_int8_layers(model: nn.Module) -> None:
    """Pack the int8 layers of `model` (quantize.py, which imports this module) in the order the
    int8 kernel reads, where the kernels will be built: PyTorch's product unpacks a packed weight at
    every call."""
    if unavailable() is not None or next(model.parameters()).device.type != "cpu":
        return
    for module in model.modules():
        if hasattr(module, "pack_for_kernels"):
            module.pack_for_kernels()
            _packed_layers.add(module)


class KernelLinear(nn.Linear):
    """nn.Linear whose calls of a few rows without autograd run on the kernels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) if y is None else y


class KernelAttention(Attention):
    """The model's Attention, whose one-token queries run on the attention kernel."""

    def attend(self, q, k, v, mask):
        y = decode_attention(q, k, v, mask)
        return super().attend(q, k, v, mask) if y is None else y


class KernelLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose calls of a few rows run on the kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = layer_norm(x, self)
        return super().forward(x) if y is None else y


class KernelMLP(MLP):
    """The model's MLP, whose GELU of a few rows runs on the kernel."""

    def activation(self, x):
        y = gelu(x)
        return super().activation(x) if y is None else y


class KernelBlock(Block):
    """The model's Block, which runs one new token per row as one call of the kernels where
    nothing needs to see inside it (decode_blocks), and its modules one by one otherwise."""

    def forward(self, h, mask=None, cache=None, layer: int = 0):
        y = decode_blocks([self], h, mask, cache, layer)
        return super().forward(h, mask, cache, layer) if y is None else y


class KernelGPT2(GPT2):
    """The model, whose blocks run one new token per row in one call of the kernels where no hook
    sees between them (the Python around a dozen block calls is a tenth of an int8 GPT-2 small
    step), and block by block otherwise."""

    def run_blocks(self, h, mask, cache):
        blocks = list(self.transformer.h)
        y = None if any(map(hooked, blocks)) else decode_blocks(blocks, h, mask, cache, 0)
        return super().run_blocks(h, mask, cache) if y is None else y


KERNEL_CLASSES = {nn.Linear: KernelLinear, Attention: KernelAttention, nn.LayerNorm: KernelLayerNorm,
                  MLP: KernelMLP, Block: KernelBlock, GPT2: KernelGPT2}


def install(model: nn.Module) -> nn.Module:
    """Put the kernels onto a loaded CPU model, in place, and return it; start their build.

    Each nn.Linear, LayerNorm, Attention, MLP, Block and the GPT2 becomes its kernel subclass (the
    same module: its parameters, hooks and adapters stay as they are, and so does the state dict),
    int8 weights are packed in the order the int8 kernel reads (their state dict stays row by
    row), and the weights move onto huge pages. Until the build is ready each call falls back to
    PyTorch's, so this returns at once.
    """
    if next(model.parameters()).device.type != "cpu":
        return model
    for module in model.modules():
        if type(module) in KERNEL_CLASSES:
            module.__class__ = KERNEL_CLASSES[type(module)]
    pack_int8_layers(model)
    model.kernels_installed = True  # int8 layers made later are packed too (modules_changed)
    weights_on_huge_pages(model)
    start_build()
    return model


HUGE_PAGE = 2 * 2**20


def weights_on_huge_pages(model: nn.Module) -> nn.Module:
    """Move the weight matrices of a CPU model into one block of memory that Linux backs with
    2 MiB pages (transparent huge pages, asked for with madvise), in place, and return the model.

    A decode step streams every weight once; on 4 KiB pages the hardware prefetcher stops at each
    page's end and the TLB misses every few microseconds, so the weights read about 10% faster on
    2 MiB pages. Values, dtypes and tied weights are unchanged, so is every result. Where huge pages
    cannot be had this costs one copy (THP set to never) or nothing (no madvise).
    """
    matrices = [p for p in model.parameters() if p.device.type == "cpu" and p.dim() == 2]  # tied ones once
    if not matrices or not hasattr(mmap, "MADV_HUGEPAGE"):
        return model
    sizes = [p.numel() * p.element_size() for p in matrices]
    offsets = [0, *itertools.accumulate(-(-n // 64) * 64 for n in sizes)]  # each on its own cache line
    total = offsets[-1]
    block = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        block.madvise(mmap.MADV_HUGEPAGE)  # before any page is touched: the first write then takes 2 MiB pages
    except OSError:  # a kernel built without THP: nothing to gain from moving
        block.close()
        return model
    memory = torch.frombuffer(block, dtype=torch.uint8)  # keeps `block` alive as long as any view of it
    start = -memory.data_ptr() % HUGE_PAGE  # the first 2 MiB boundary: from there every page can be huge
    with torch.no_grad():
        for p, offset, size in zip(matrices, offsets, sizes):
            moved = memory[start + offset:start + offset + size].view(p.dtype).view(p.shape)
            moved.copy_(p)
            p.data = moved
    return model

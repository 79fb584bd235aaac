"""The decode kernels: matrix-vector products for a few rows, fp32 or int8 weights, and attention
for one new token per row, on a CPU.

Decoding one token multiplies one row per sequence by every weight matrix, so its speed is how
fast the weights stream from memory. MKL's product reads them at 8-10 GB/s on the 2-core AVX2
machine of docs/performance.md; `kernels.cpp` (dot products of contiguous weight rows, several
input rows sharing each read) reads fp32 weights at about 17 GB/s, and int8 weights, converted
to float in registers and scaled per output channel afterwards, in a third of the fp32 time. The
inputs stay fp32: int8 is weight-only, so nothing is rounded per call. On a CPU with AVX-512 they
are built for it (vectors of 16 floats, larger blocks), which pays where arithmetic counts:
prompts, batches, int8.

The attention kernel does what PyTorch's scaled_dot_product_attention does for a query of one
token, in half its time or less at the lengths of a chat (measured in docs/performance.md).
`decode_blocks` runs a whole decode step's blocks in one call, with the very operations the
modules would run (adapters' LoRA updates included, which both add with `add_lora`), so that
Python's part of a step (module calls, views) goes. It runs them in one OpenMP region, whose
threads wait for each other at a barrier of their own: in a region per product, as before, each
region in the scheduler's thread waited for a sleeping worker. `weights_on_huge_pages` puts a
loaded model's weights where they stream fastest.

Each input row is summed in the same order whatever the number of rows, and a row's attention
whatever the other rows' lengths (its tokens keeping their cache slots, as the scheduler's do),
so a request decodes to bit-identical results alone or in a batch of other users' requests.

The C++ is compiled on first use by torch.utils.cpp_extension (about a minute; torch caches the
build in ~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR). Where that cannot happen (no
AVX2, as on ARM; no C++ compiler; STUDIO_DECODE_KERNELS=0) everything runs on PyTorch's own
products and attention, with the same results up to rounding.
"""
from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import warnings
from pathlib import Path

import torch


def cpu_vendor() -> str:
    """The CPU's vendor as Linux names it ("AuthenticAMD", "GenuineIntel"); "" where unknown."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("vendor_id")), "")
    except OSError:
        return ""


# The CPU's widest vectors, as PyTorch found them (ATEN_CPU_CAPABILITY=avx2 makes an AVX-512 CPU
# build and run the AVX2 kernels, and PyTorch's own CPU code stop at AVX2 too).
CAPABILITY = torch.backends.cpu.get_cpu_capability()
WIDE = CAPABILITY == "AVX512"
# Calls over more rows than this go to PyTorch's product (MKL). On the AVX2 AMD machine of
# docs/performance.md MKL was faster past 48 rows; on the AVX-512 AMD one the kernels multiply up
# to 512 rows (a whole prompt chunk) 1.2-1.8x as fast as MKL, which runs a generic code path on
# AMD CPUs. On an Intel CPU MKL takes its tuned path, so prompts stay with it (not measured).
KERNEL_ROWS = 512 if WIDE and cpu_vendor() == "AuthenticAMD" else 48
SOURCE = Path(__file__).with_name("kernels.cpp")

log = logging.getLogger(__name__)
_lock = threading.Lock()
_compiled: list = []  # [module or None] once loading was tried


def decode_kernels():
    """The compiled module, built on the first call, or None where it cannot be (see above)."""
    if not _compiled:  # the lock only until loading was tried: a decode step calls this fifty times
        with _lock:
            if not _compiled:
                _compiled.append(_build())
    return _compiled[0]


def _build():
    if os.environ.get("STUDIO_DECODE_KERNELS", "1") == "0":
        return None
    if CAPABILITY not in ("AVX2", "AVX512"):
        return None
    from torch.utils.cpp_extension import load  # imported here: it is slow to import, and rarely needed
    log.info("loading the decode kernels (compiled on first use, which takes about a minute)")
    try:
        # -ffp-contract=off: the same rounding in every template copy (the FMAs meant are intrinsics).
        # An AVX-512 build under its own name, so that its cache never stands in for the AVX2 one.
        wide = ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"] if WIDE else []
        return load("studio_decode_kernels" + ("_avx512" if WIDE else ""), [str(SOURCE)],
                    extra_cflags=["-O3", "-mavx2", "-mfma", *wide, "-fopenmp", "-ffp-contract=off"],
                    extra_ldflags=["-fopenmp"])
    except Exception as error:  # a missing compiler or ninja: slower, not broken
        warnings.warn(f"the decode kernels could not be built, so decoding runs on PyTorch's products and attention "
                      f"(slower; results the same up to rounding): {error}")
        return None


def recorded(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record a call on these tensors: then it is PyTorch's to run."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           scale: torch.Tensor | None = None) -> torch.Tensor | None:
    """x @ weight.T, times `scale` per output channel (int8 weights), plus bias; or None when the
    caller should use PyTorch's product.

    Here: what the kernels are for, decided before they are ever built (a training step or a GPU
    model never builds them): CPU inputs, at most KERNEL_ROWS rows, nothing for autograd to record.
    kernels.cpp: what they can take (dtypes, memory order, shapes; a mismatch is PyTorch's to name).
    """
    if not x.is_cpu or x.numel() > KERNEL_ROWS * weight.shape[-1] or recorded(x, weight, bias):
        return None
    kernels = decode_kernels()
    return None if kernels is None else kernels.linear(x, weight, bias, scale)


def add_lora(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float,
             rows: torch.Tensor | None) -> bool:
    """out += (x @ a.T) @ b.T * scale over the batch rows listed (all when None), in place: an
    adapter's LoRA update (model/adapters.py); False, having done nothing, when the caller should
    use PyTorch. A row's update is the same bits whatever the other rows (see add_lora_rows in
    kernels.cpp). Taken for decode steps, x (rows, 1, in), where that matters: as for `linear`,
    on a CPU, at most KERNEL_ROWS rows, nothing for autograd to record. A prompt is prefilled
    alone, and PyTorch's products of its tokens are faster (a 40-token prompt of GPT-2 small
    with rank-8 updates everywhere: 18 ms for them against 28 on the kernel)."""
    if not x.is_cpu or x.dim() != 3 or x.shape[1] != 1 or x.shape[0] > KERNEL_ROWS or recorded(out, x, a, b):
        return False
    kernels = decode_kernels()
    return kernels is not None and kernels.add_lora(out, x, a, b, scale, rows)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(dim), masked) v for one query token per row, or None when the caller
    should use PyTorch's attention.

    q (rows, heads, 1, dim); keys and values (rows, heads, slots, dim), views of the KV cache;
    mask None or (rows, 1, 1, slots), True where the query may look. As for `linear`, this
    decides which calls are the kernel's (CPU, one query token, nothing for autograd); the C++
    checks what it can take.
    """
    if q.shape[2] != 1 or not q.is_cpu or recorded(q, keys, values):
        return None
    if mask is not None and (mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1):
        return None  # a mask per head, or one broadcast over the rows: PyTorch's
    kernels = decode_kernels()
    return None if kernels is None else kernels.decode_attention(q, keys, values,
                                                                 None if mask is None else mask[:, 0, 0])


_ABSENT = torch.empty(0)  # a bias or scale a layer does not have, as decode_blocks takes it

# An adapter's update to one projection of a one-call decode step: (the projection's number in
# decode order, 4 per block; batch rows or None for all; lora_A; lora_B; scale).
LoraUpdate = tuple[int, "torch.Tensor | None", torch.Tensor, torch.Tensor, float]


def decode_blocks(h: torch.Tensor, params: list[torch.Tensor | None], lora: list[LoraUpdate], eps: float,
                  n_head: int, keys: torch.Tensor, values: torch.Tensor, slots: list[int], end: int,
                  mask: torch.Tensor | None) -> torch.Tensor | None:
    """One decode step through every Pre-LN block in one call, bit for bit what the blocks'
    modules compute, adapters' hooks included (see decode_blocks in kernels.cpp); or None, having
    done nothing, where the kernels cannot be built or the modules would not run on them
    throughout (a head width that is not a multiple of 8, weights in another layout), or an
    adapter's weights do not fit.

    h (rows, 1, width); params as GPT2.one_call_params lists them, None for a bias or scale a
    layer does not have; lora the adapters' updates as it lists them; keys and values the whole KV
    cache, row r's new key and value going to slot slots[r]; row r then attends the slots the mask
    marks among the first `end` (mask as for decode_attention), or with no mask (no row has
    padding) its slots up to slots[r], so that rows at different lengths need no mask built.
    """
    kernels = decode_kernels()
    if kernels is None:
        return None
    return kernels.decode_blocks(h, [_ABSENT if p is None else p for p in params], lora, eps, n_head, keys, values,
                                 slots, end, None if mask is None else mask[:, 0, 0])


HUGE_PAGE = 2 * 2**20


def weights_on_huge_pages(model: torch.nn.Module) -> torch.nn.Module:
    """Move the weight matrices of a CPU model into one block of memory that Linux backs with
    2 MiB pages (transparent huge pages, asked for with madvise), in place, and return the model.

    A decode step streams every weight once. On 4 KiB pages the hardware prefetcher stops at
    each page's end and the TLB misses every few microseconds; on 2 MiB pages the kernels read
    GPT-2 small's matrices about 10% faster, and PyTorch's own sum over them about 7%
    (docs/performance.md). Values, dtypes and tied weights are unchanged, so is every result.
    Where huge pages cannot be had this costs one copy (THP set to never) or nothing (not
    Linux, or a kernel without THP, where madvise refuses).
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

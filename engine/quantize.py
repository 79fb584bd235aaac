"""int8 quantisation of every Linear layer's weights, the output head included.

Decoding one token reads every weight once, so on a CPU (and on a GPU at small batch) its speed
is set by memory bandwidth: int8 weights are a quarter of fp32's bytes. Each output channel (a
row of the weight) gets its own scale, max|w| / 127, symmetric around zero.

Each layer's inputs are rounded to 8 bits too, as it runs: one scale per group of GROUP values of
a row (rows_in_8_bits), so the CPU can multiply them with the weights in its integer dot-product
instructions. Per row alone cost the bundled model 1.0% of validation perplexity; per group of 64,
0.3% (docs/performance.md). Each row is rounded from its own values, so a token's result does not
depend on the other rows of its call (other users' requests, in a batched decode step). On a CPU
the weights are packed for the int8 kernel of engine/kernels.py (`pack`, when the kernels are
installed), which takes decode steps and prompts of any length; elsewhere (a GPU, the kernels not
built yet or not buildable, a model in another dtype) PyTorch computes the same product in
floating point: the rounded inputs times the int8 weights, scaled.

GPT-2's output head shares its weight with the token embedding. The head gets its own int8 copy
(it is a quarter of the model's reads per token) while the embedding lookup, which reads one
row per token, keeps the floating-point table.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels

QUANTIZATIONS = ("int8",)
GROUP = 64  # input values sharing one 8-bit scale (kernels.cpp's kGroup)
BLOCK = 16  # output channels per block of a packed weight (kernels.cpp's kBlock)


def rows_in_8_bits(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 8 bits as the int8 kernel rounds it, in x's dtype: along the last dimension,
    in groups of GROUP values, scale = max|x| / 127 and x becomes round(x / scale) * scale (half
    to even). kernels.cpp takes the same float operations, so the 8-bit values are the same.
    A group whose scale would be below the smallest normal float becomes 0 (x / scale could pass
    127 there); a NaN or an infinity makes NaN of its group."""
    width = x.shape[-1]
    groups = F.pad(x, (0, -width % GROUP)).unflatten(-1, (-1, GROUP))
    scale = groups.abs().amax(dim=-1, keepdim=True) / 127
    steps = torch.where(scale >= torch.finfo(x.dtype).tiny, torch.round(groups / scale), 0.0)
    return (steps * scale).flatten(-2)[..., :width]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """An int8 weight (out, in), `in` a multiple of GROUP, in the order the int8 kernel reads it:
    blocks of BLOCK output channels, and in each block, for every 4 inputs, the channels' 4 bytes
    one after another (what one vpdpbusd multiplies, kernels.cpp); the channels past the last
    whole block row by row. Every byte plus 128, as uint8: the instruction takes unsigned weights,
    and the kernels take no other int8 weight (a row-by-row one is PyTorch's). The same shape."""
    out, width = weight.shape
    whole = out // BLOCK * BLOCK
    blocks = weight[:whole].reshape(-1, BLOCK, width // 4, 4).transpose(1, 2)
    flat = torch.cat([blocks.flatten(), weight[whole:].flatten()])
    return flat.bitwise_xor(-128).view(torch.uint8).view(out, width)


def unpack(weight: torch.Tensor) -> torch.Tensor:
    """The (out, in) int8 weight that `pack` made `weight` of."""
    out, width = weight.shape
    whole = out // BLOCK * BLOCK
    flat = weight.flatten().view(torch.int8).bitwise_xor(-128)
    blocks = flat[:whole * width].view(-1, width // 4, BLOCK, 4).transpose(1, 2).reshape(whole, width)
    return torch.cat([blocks, flat[whole * width:].view(-1, width)])


class Int8Linear(nn.Module):
    """A Linear layer whose weight is int8 with one floating-point scale per output channel."""

    def __init__(self, weight: torch.Tensor, bias: nn.Parameter | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        # The weight stays a parameter so the model's parameter count is unchanged; .to(dtype)
        # leaves integer tensors as they are, and casts the scale with the rest of the model.
        self.weight = nn.Parameter(torch.round(w / scale[:, None]).to(torch.int8), requires_grad=False)
        self.register_buffer("scale", scale.to(weight.dtype))
        self.bias = bias

    @property
    def packed(self) -> bool:
        """Whether the weight is in the CPU kernel's order (pack_for_kernels), not row by row."""
        return self.weight.dtype == torch.uint8

    def pack_for_kernels(self) -> None:
        """Put the weight in the order the CPU's int8 kernel reads (`pack`), where the kernel can
        take it: groups of GROUP inputs whole (every GPT-2), float32 scales. kernels.install does,
        on a CPU where the kernels will be built; elsewhere (a GPU) the weight stays row by row for
        PyTorch's product, which would otherwise unpack it at every call. One assignment, so a
        call running meanwhile reads one weight or the other, whole."""
        if not self.packed and self.in_features % GROUP == 0 and self.scale.dtype == torch.float32:
            self.weight.data = pack(self.weight.data)

    def unpack_for_pytorch(self) -> None:
        """The weight row by row again (the kernels' build failed), in one assignment."""
        if self.packed:
            self.weight.data = unpack(self.weight.data)

    def rows(self, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The int8 weight (or `weight`, one read of it), (out, in) row by row."""
        weight = self.weight if weight is None else weight
        return unpack(weight) if weight.dtype == torch.uint8 else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight  # read once: install or a failed build may repack it meanwhile
        y = kernels.linear(x, weight, self.bias, self.scale)
        if y is not None:
            return y
        y = F.linear(rows_in_8_bits(x), self.rows(weight).to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias

    # The state dict holds the weight row by row, packed or not, so that it loads into any
    # Int8Linear (and a model's checkpoint never depends on the CPU it was saved on).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.packed:
            destination[prefix + "weight"] = self.rows()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "weight"
        incoming = state_dict.get(key)
        if self.packed and incoming is not None and incoming.dtype == torch.int8 and incoming.shape == self.weight.shape:
            state_dict[key] = pack(incoming)  # load_state_dict's own copy of the dict
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_weights(model: nn.Module, method: str = "int8") -> nn.Module:
    """Replace every nn.Linear of `model` with an Int8Linear, in place, and return the model.

    A layer's forward hooks (the adapters', model/adapters.py) move to its replacement.
    """
    if method not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {method!r}; known: {', '.join(QUANTIZATIONS)}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                quantized = Int8Linear(child.weight, child.bias)
                quantized._forward_hooks.update(child._forward_hooks)
                quantized.has_lora_hook = getattr(child, "has_lora_hook", False)
                setattr(parent, name, quantized)
    kernels.modules_changed(model)
    return model

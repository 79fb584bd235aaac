"""int8 quantisation of every Linear layer's weights, the output head included.

Decoding one token reads every weight once, so on a CPU (and on a GPU at small batch) its speed
is set by memory bandwidth: int8 weights are a quarter of fp32's bytes. Each output channel (a
row of the weight) gets its own scale, max|w| / 127, symmetric around zero.

On a CPU the matmul is fbgemm's dynamic int8 linear (torch.ops.quantized.linear_dynamic), which
also rounds each call's input to 7 bits with one scale per call. One scale per call would tie
each token's result to the other rows of the call (other users' requests, in a batched decode
step), so every token is first scaled by its own peak to [-1, 1] and a pinning row fixes the
call's range at exactly [-1, 1]: each token is rounded with its own scale, and gets the same
result alone or in any batch. It is used because it is fast:
PyTorch's weight-only kernel (aten._weight_int8pack_mm) measured ten times slower than fp32 on
an AVX2 CPU (docs/performance.md). Elsewhere (a GPU, or bf16 on a CPU) the int8 weights are
scaled back to the input's dtype and only the weights are rounded.

GPT-2's output head shares its weight with the token embedding. The head gets its own int8 copy
(it is a quarter of the model's reads per token) while the embedding lookup, which reads one
row per token, keeps the floating-point table.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

QUANTIZATIONS = ("int8",)


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
        self.packed = fbgemm_pack(self.weight, scale) if weight.device.type == "cpu" else None
        pin = torch.zeros(1, self.in_features)
        pin[0, :2] = torch.tensor([1.0, -1.0])
        self.register_buffer("pin", pin, persistent=False)  # the row that fixes each call's input range

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.device.type != "cpu" or x.dtype != torch.float32:
            y = F.linear(x, self.weight.to(x.dtype)) * self.scale
            return y if self.bias is None else y + self.bias
        # Few operations, none allocating more than it must: at batch 1 they cost as much as the
        # product itself on the small layers.
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        normalised = torch.empty(n + 1, self.in_features)
        normalised[n] = self.pin[0]
        peak = torch.linalg.vector_norm(rows, math.inf, dim=1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny)
        torch.div(rows, peak, out=normalised[:n])
        # reduce_range: 7-bit inputs, so that AVX2's int16 pair sums (vpmaddubsw) cannot saturate.
        y = torch.ops.quantized.linear_dynamic(normalised, self.packed, True)[:n]
        y = y * peak if self.bias is None else torch.addcmul(self.bias, y, peak)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def fbgemm_pack(weight: torch.Tensor, scale: torch.Tensor):
    """The int8 weight in the layout fbgemm's kernel reads, made once. The bias is added after
    the product is scaled back to each token's range."""
    with warnings.catch_warnings():
        # PyTorch deprecates quantized tensors, which this packing goes through; torch is pinned
        # (requirements.txt), and docs/performance.md says what to do when they are removed.
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        qweight = torch.quantize_per_channel(weight.float() * scale[:, None], scale.double(),
                                             torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qweight, None)


def quantize_weights(model: nn.Module, method: str = "int8") -> nn.Module:
    """Replace every nn.Linear of `model` with an Int8Linear, in place, and return the model.

    Quantise before loading adapters: their hooks attach to the layers that will run.
    """
    if method not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {method!r}; known: {', '.join(QUANTIZATIONS)}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if getattr(child, "has_lora_hook", False):
                    raise ValueError("quantize the model before loading adapters: the adapters' hooks are on "
                                     "the layers that quantizing replaces")
                setattr(parent, name, Int8Linear(child.weight, child.bias))
    return model

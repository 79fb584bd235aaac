"""What makes decoding fast and shared, put onto a loaded model from outside: the KV cache for
rows of different lengths (cache), sampling and the token loop (generate), the continuous-batching
scheduler, int8 weights (quantize), the CPU decode kernels (kernels), the residual stream read
with hooks (residual), steering added to it per request (steering) and activation patching
(patching). Stands on model/ alone; tasks/, serve/ and train/ use it."""
from __future__ import annotations

from model.gpt2 import GPT2

from . import kernels, steering
from .quantize import quantize_weights


def prepare_for_serving(model: GPT2, quantize: str | None = None) -> GPT2:
    """A loaded model as the app serves it, in place: int8 weights if asked (adapters' hooks move
    with their layers), then the decode kernels on a CPU (built in the background; until they are
    ready, and wherever they cannot be, it decodes on PyTorch), and the steering hooks, which add
    nothing until a request steers (put on now, not while another thread's forward call runs)."""
    if quantize is not None:
        quantize_weights(model, quantize)
    steering.install(model)
    return kernels.install(model)

"""The residual stream of one forward pass, read with forward hooks: what the Architecture tab's
live view and the Pre-LN lab measure. The network itself never knows it is being read."""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.nn as nn

from model.gpt2 import GPT2


@contextmanager
def recording_outputs(modules: list[nn.Module]):
    """Collects each module's output of the forward calls this thread makes inside the block, in
    module order. Other threads may be generating with the same model meanwhile (the app serves
    several requests at once): their forward calls are not recorded."""
    outputs: list[torch.Tensor | None] = [None] * len(modules)
    recorder = threading.get_ident()

    def keep(index):
        def hook(module, inputs, output):
            if threading.get_ident() == recorder:
                outputs[index] = output.detach()
        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(modules)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def residual_stream(model: GPT2, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The residual stream (batch, time, n_embd) after the embeddings and after each block, and
    the logits, from one forward pass."""
    with recording_outputs([model.transformer.wte, model.transformer.wpe, *model.transformer.h]) as outputs:
        logits = model(ids)
    token, position, *blocks = outputs
    return [token + position, *blocks], logits

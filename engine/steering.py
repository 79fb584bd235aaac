"""Steering: alpha * v added to the residual stream after block L, per request, from outside the model.

v is the difference of the residual stream after block L at the last token of a positive and a
negative text (ActAdd), averaged over pairs of lines (contrastive activation addition); L = 0 is
the stream after the embeddings, L = n_layer after the last block. In Pre-LN nothing normalises
the stream between blocks, so what is added reaches ln_f intact.

It is added by hooks on the blocks (a forward hook on block L-1; for L = 0 a pre-hook on block 0),
which read the rows to steer from a ContextVar set around a forward call (`steered`), as the
adapters do (model/adapters.py): two threads each see their own, and one batched decode step can
steer each row its own way. The decode kernels (engine/kernels.py) run an unsteered decode step's
blocks in one call, past these hooks (marked in each block's `steering_hooks`; they add nothing
then), and a steered one block by block, through them. A row without steering keeps the bits of a
run without steering (plan_of says why).
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Sequence

import torch

from model.gpt2 import GPT2
from model.tokenizer import Tokenizer

from .residual import residual_stream


@dataclass(frozen=True, eq=False)  # compared and hashed as itself: a request's steering
class Steering:
    layer: int  # 0: after the embeddings; n_layer: after the last block
    vector: torch.Tensor  # (n_embd,), on the model's device and in its dtype
    strength: float

    @functools.cached_property
    def addition(self) -> torch.Tensor:
        """strength * vector, as (1, 1, n_embd): what each position of a steered row gets."""
        return (self.strength * self.vector).view(1, 1, -1)


def as_steering(steering: Steering | None) -> Steering | None:
    """The steering a row runs with: None for none, or for a strength of 0 (the unsteered run exactly)."""
    return None if steering is None or steering.strength == 0 else steering


# {layer: what each batch row gets added after that block, (rows, 1, n_embd), or (1, 1, n_embd) for
# all alike}, or None: nothing steered.
Plan = dict[int, torch.Tensor]
ACTIVE: ContextVar[Plan | None] = ContextVar("steering", default=None)
_installing = threading.Lock()


@functools.lru_cache(maxsize=32)
def plan_of(steerings: tuple[Steering | None, ...]) -> Plan | None:
    """Where each row of a batch is steered: at each layer, one tensor of every row's addition, 0
    for a row not steered there. Adding +0.0 leaves every float exactly as it is (bit for bit; only
    a -0.0 becomes +0.0, the same number in every later sum and product), so those rows get the
    bits of an unsteered run, and one addition over the batch costs far less than picking rows
    (index_add took 6% of a decode step of the bundled model; this, under 1%: bench/steering.py).
    A scheduler's rows stay the same for many steps, so the plan is made once for them (cached by
    the rows' Steering objects, which are its keys)."""
    layers = {steering.layer for steering in steerings if steering is not None}
    if not layers:
        return None
    plan = {}
    for layer in layers:
        rows = [s.addition if s is not None and s.layer == layer else None for s in steerings]
        like = next(addition for addition in rows if addition is not None)
        plan[layer] = torch.cat([torch.zeros_like(like) if addition is None else addition for addition in rows])
    return plan


def add_steering(layer: int, h: torch.Tensor) -> torch.Tensor:
    """h (batch, time, n_embd), the residual stream after block `layer`, with the steered rows' additions."""
    plan = ACTIVE.get()
    addition = None if plan is None else plan.get(layer)
    return h if addition is None else h + addition


def install(model: GPT2) -> None:
    """Put the steering hooks onto a model, once (they add nothing until a forward call is steered)."""
    with _installing:
        if getattr(model, "has_steering_hooks", False):
            return
        blocks = model.transformer.h
        handles = [(blocks[0], blocks[0].register_forward_pre_hook(
            lambda block, args: (add_steering(0, args[0]), *args[1:])))]
        for i, block in enumerate(blocks):
            handles.append((block, block.register_forward_hook(
                lambda block, args, output, layer=i + 1: add_steering(layer, output))))
        # Marked, so that the decode kernels run unsteered calls past them (engine/kernels.py's hooked)
        for block, handle in handles:
            block.steering_hooks = block.__dict__.get("steering_hooks", set()) | {handle.id}
        model.has_steering_hooks = True


@contextmanager
def steered(model: GPT2, steering: Steering | None | Sequence[Steering | None]):
    """Run the forward calls inside this block with `steering` added: one for every row, or a
    sequence with each batch row's own (None: that row is not steered)."""
    if steering is None or isinstance(steering, Steering):
        steering = as_steering(steering)
        plan = None if steering is None else {steering.layer: steering.addition}
    else:
        plan = plan_of(tuple(as_steering(row) for row in steering))
    if plan is not None:
        install(model)
    token = ACTIVE.set(plan)
    try:
        yield
    finally:
        ACTIVE.reset(token)


def check_steering(model: GPT2, steering: Steering | None) -> None:
    if steering is None:
        return
    if not 0 <= steering.layer <= model.config.n_layer:
        raise ValueError(f"steering layer {steering.layer} is not between 0 and {model.config.n_layer}")
    if steering.vector.shape != (model.config.n_embd,):
        raise ValueError(f"a steering vector of shape {tuple(steering.vector.shape)} does not fit "
                         f"n_embd {model.config.n_embd}")


@torch.inference_mode()
def streams_at(model: GPT2, tokenizer: Tokenizer, texts: Sequence[str], layer: int) -> dict[str, torch.Tensor]:
    """Each text's residual stream after block `layer`, (time, n_embd), each text run alone. A text
    longer than the context is read by its last n_positions tokens."""
    if not 0 <= layer <= model.config.n_layer:
        raise ValueError(f"steering layer {layer} is not between 0 and {model.config.n_layer}")

    def stream_at_layer(text: str) -> torch.Tensor:
        ids = tokenizer.encode(text)[-model.config.n_positions:]
        if not ids:
            raise ValueError("a steering text is empty")
        stream, _ = residual_stream(model, torch.tensor([ids], device=model.device))
        return stream[layer][0]

    return {text: stream_at_layer(text) for text in dict.fromkeys(texts)}


def typical_norm(streams: dict[str, torch.Tensor]) -> float:
    """The typical residual norm of these streams: the mean over all their tokens."""
    return float(torch.cat([stream.norm(dim=-1) for stream in streams.values()]).mean())


def residual_norm(model: GPT2, tokenizer: Tokenizer, texts: Sequence[str], layer: int) -> float:
    """The typical residual norm after block `layer` over `texts`' tokens: what a strength is
    measured against, for a vector that came without texts of its own (a file's)."""
    return typical_norm(streams_at(model, tokenizer, texts, layer))


@torch.inference_mode()
def steering_vector(model: GPT2, tokenizer: Tokenizer, positive: str | Sequence[str], negative: str | Sequence[str],
                    layer: int) -> tuple[torch.Tensor, float]:
    """The steering vector (n_embd,) after block `layer` from pairs of texts (the i-th positive and
    negative form a pair): the mean over pairs of the difference of their residual streams at their
    last token. And the typical residual norm there, the mean over the texts' tokens, which says
    what a strength means. Identical texts give exactly zero (each text is run alone, so a pair
    runs the same numbers)."""
    positive = [positive] if isinstance(positive, str) else list(positive)
    negative = [negative] if isinstance(negative, str) else list(negative)
    if not positive or len(positive) != len(negative):
        raise ValueError(f"steering needs pairs of texts: {len(positive)} positive, {len(negative)} negative")
    streams = streams_at(model, tokenizer, positive + negative, layer)
    differences = [streams[p][-1] - streams[n][-1] for p, n in zip(positive, negative)]
    return torch.stack(differences).mean(dim=0), typical_norm(streams)

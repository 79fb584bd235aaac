"""Activation patching (causal tracing, as in ROME: Meng et al. 2022, "Locating and Editing Factual
Associations in GPT"): which activations carry what the model needs to give its answer.

A clean run and a corrupted run (another prompt of as many tokens, or the clean one with noise
added to some tokens' embeddings) give the answer probabilities p_clean and p_corrupted. Restoring
one activation of the clean run into the corrupted run, at one layer and one position, gives
p_patched; its normalised effect is

    (p_patched - p_corrupted) / (p_clean - p_corrupted)

1 where that activation alone brings the clean answer back, 0 where it changes nothing. The
activations are each block's output (the residual stream), and its attention and MLP outputs,
the terms each block adds to the stream.

Both runs are recorded once, with forward hooks (the network never knows); a restoring run starts
from the recorded stream at its layer, so the blocks before it are not run again, and the
positions of one layer run as one batch of patched copies.

Exact where it should be: each batch carries, beside its patched copies, the clean run (every
position restored) and the corrupted run (nothing restored), once per noise sample, and its effects
are normalised by those rows' probabilities. A row's numbers do not depend on the other rows of its batch, but a
matrix product of a different shape rounds differently in the last bits; in one batch, restoring
the stream the head reads (the last layer at the last position) gives exactly 1, and restoring
nothing exactly 0.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn

from model.gpt2 import GPT2

from .residual import recording_outputs

KINDS = ("residual", "attention", "mlp")
# Noise on the corrupted tokens' embeddings, as ROME adds it: 3 times the embeddings' standard
# deviation (here of the whole token embedding matrix), averaged over a few seeded samples so
# that a trace is the same each time it is asked for.
NOISE_SCALE = 3.0
NOISE_SAMPLES = 5
NOISE_SEED = 0

Progress = Callable[[int, int], None]  # (steps done, steps in all)


@dataclass(frozen=True)
class Run:
    """One run's activations, each (batch, time, n_embd) by layer: the stream entering each block,
    and each block's output ("residual"), attention output and MLP output."""
    inputs: list[torch.Tensor]
    outputs: dict[str, list[torch.Tensor]]

    @property
    def last(self) -> torch.Tensor:
        """(batch, n_embd): the stream the head reads, at the last position."""
        return self.outputs["residual"][-1][:, -1]


def embeddings(model: GPT2, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, time, n_embd) each: the tokens' embeddings and their positions'."""
    device = model.device
    tokens = model.transformer.wte(torch.tensor([ids], device=device))
    return tokens, model.transformer.wpe(torch.arange(len(ids), device=device))[None]


def recorded_run(model: GPT2, h: torch.Tensor) -> Run:
    """Every block run on the stream `h` (after the embeddings), as GPT2.forward runs them on a
    prompt without padding, with what each block reads and writes recorded."""
    blocks = model.transformer.h
    inputs, outputs = [], []
    with recording_outputs([b.attn for b in blocks] + [b.mlp for b in blocks]) as added:
        for block in blocks:
            inputs.append(h)
            h = block(h)
            outputs.append(h)
    n = len(blocks)
    return Run(inputs, {"residual": outputs, "attention": added[:n], "mlp": added[n:]})


def answer_probabilities(model: GPT2, last: torch.Tensor, answer: int) -> torch.Tensor:
    """(rows,): the answer's probability after each row of the last position's stream."""
    return model.lm_head(model.transformer.ln_f(last)).float().softmax(-1)[:, answer]


@contextmanager
def replaced_output(module: nn.Module, replace: Callable[[torch.Tensor], torch.Tensor]):
    """`module`'s output passed through `replace` in the forward calls this thread makes inside the
    block; other threads' calls (another request generating meanwhile) are left alone."""
    caller = threading.get_ident()

    def hook(module, inputs, output):
        return replace(output) if threading.get_ident() == caller else None

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class Patching:
    """The clean and corrupted runs of one prompt, recorded, ready to restore from.

    corrupted: another prompt's ids, as many as the clean one's; or None, and `noised` names the
    clean prompt's positions whose token embeddings get noise (`samples` draws from `seed`).
    answer: the token whose probability is traced; None: the clean run's likeliest next token.
    """

    @torch.no_grad()
    def __init__(self, model: GPT2, clean: list[int], corrupted: list[int] | None = None,
                 noised: Sequence[int] = (), answer: int | None = None, samples: int = NOISE_SAMPLES,
                 seed: int = NOISE_SEED):
        if corrupted is not None and len(corrupted) != len(clean):
            raise ValueError(f"the corrupted prompt has {len(corrupted)} tokens, the clean one {len(clean)}")
        if corrupted is None and not noised:
            raise ValueError("nothing to corrupt: give a corrupted prompt or positions to noise")
        self.model, self.tokens = model, len(clean)
        tokens, positions = embeddings(model, clean)
        if corrupted is not None:
            other, _ = embeddings(model, corrupted)
        else:
            other = tokens.expand(samples, -1, -1).clone()
            noise = torch.randn(samples, len(noised), tokens.shape[-1], generator=torch.Generator().manual_seed(seed))
            scale = NOISE_SCALE * model.transformer.wte.weight.float().std()
            other[:, list(noised)] += (scale * noise).to(other.device, other.dtype)
        # both in one batch: where they agree (the positions before the first corrupted one), so do
        # their streams, to the last bit
        both = recorded_run(model, torch.cat([tokens, other]) + positions)
        self.clean, self.corrupted = (Run([h[rows] for h in both.inputs],
                                          {kind: [h[rows] for h in out] for kind, out in both.outputs.items()})
                                      for rows in (slice(0, 1), slice(1, None)))
        self.samples = self.corrupted.last.shape[0]
        self.answer = int(model.lm_head(model.transformer.ln_f(self.clean.last)).argmax()) if answer is None else answer
        p = answer_probabilities(model, both.last, self.answer)  # one head call: equal streams, equal numbers
        self.p_clean, self.p_corrupted = float(p[0]), float(p[1:].mean())

    @torch.no_grad()
    def effects(self, kind: str, layer: int, restore: torch.Tensor) -> torch.Tensor:
        """(rows,): the normalised effect of restoring the clean run's `kind` output of block
        `layer` (0-based) at the positions each row of `restore` (rows, time; bool) marks, averaged
        over the noise samples. 0 where the batch's clean and corrupted rows give the answer the
        same probability (Patching's caller refuses that case before asking)."""
        S, rows = self.samples, restore.shape[0]
        clean_start, corrupted_start = self.start(self.clean, kind, layer), self.start(self.corrupted, kind, layer)
        # per sample: the clean run (all restored), the corrupted run (nothing), then each row of `restore`
        h = torch.cat([clean_start.expand(S, -1, -1), corrupted_start, corrupted_start.repeat(rows, 1, 1)])
        everywhere = torch.ones(S, self.tokens, dtype=torch.bool)
        mask = torch.cat([everywhere, ~everywhere, restore.bool().repeat_interleave(S, 0)])[..., None].to(h.device)
        clean_value = self.clean.outputs[kind][layer]

        def restored(x: torch.Tensor) -> torch.Tensor:
            return torch.where(mask, clean_value, x)

        blocks = self.model.transformer.h
        if kind == "residual":
            h = restored(h)
            for block in blocks[layer + 1:]:
                h = block(h)
        else:
            with replaced_output(getattr(blocks[layer], "attn" if kind == "attention" else "mlp"), restored):
                for block in blocks[layer:]:
                    h = block(h)
        # averaged over the samples in one reduction, so that equal rows give equal means
        p = answer_probabilities(self.model, h[:, -1], self.answer).view(rows + 2, S).mean(1)
        gap, change = p[0] - p[1], p[2:] - p[1]
        return torch.where(gap != 0, change / gap, torch.zeros_like(change)).cpu()

    def start(self, run: Run, kind: str, layer: int) -> torch.Tensor:
        """Where a restoring run starts: after block `layer` for its output, before it for the terms
        it adds."""
        return run.outputs["residual"][layer] if kind == "residual" else run.inputs[layer]

    def grid(self, kind: str, progress: Progress | None = None, done: int = 0, total: int | None = None) -> torch.Tensor:
        """(positions, layers): the effect of restoring each one alone. progress(done, total) after
        each layer (done counted on from `done`, of `total` steps: a caller's larger count)."""
        layers = self.model.config.n_layer
        total = layers if total is None else total
        one_each = torch.eye(self.tokens, dtype=torch.bool)
        columns = []
        for layer in range(layers):
            columns.append(self.effects(kind, layer, one_each))
            if progress is not None:
                progress(done + layer + 1, total)
        return torch.stack(columns, dim=1)

    def grids(self, progress: Progress | None = None) -> dict[str, torch.Tensor]:
        """Every kind's grid, by kind; progress(done, total) after each layer of each."""
        layers = self.model.config.n_layer
        return {kind: self.grid(kind, progress, i * layers, len(KINDS) * layers) for i, kind in enumerate(KINDS)}

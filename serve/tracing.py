"""Activation patching ("Trace") as the app serves it: a request's checks, and its record.

A clean prompt; a corrupted prompt of as many tokens, or noise on a span of the clean prompt; the
answer token (by default the clean run's likeliest next token). The computation is
engine/patching.py's; here the texts become tokens, and whatever the request gets wrong is a
Refusal naming it. Where the corruption leaves the answer's probability exactly as it was there is
nothing to normalise by, and the trace is refused (rather than answered with zeros that would say
"no effect" when there is no effect to find).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.patching import NOISE_SAMPLES, Patching, Progress
from model.gpt2 import GPT2
from model.tokenizer import Tokenizer
from tasks.messages import Refusal

from .inspection import MAX_TOKENS, token_label

# What a trace's fields may hold, in characters: a trace takes at most MAX_TOKENS tokens, and
# these bound the tokenizing done before that is known.
MAX_CHARS = {"clean": 4_000, "corrupted": 4_000, "answer": 200, "noise_span": 4_000}


@dataclass(frozen=True)
class Trace:
    tokens: list[str]  # the clean prompt's tokens, printable: the grids' rows
    layers: int  # the grids' columns
    grid: torch.Tensor  # (positions, layers): the effect of restoring each block's output there
    attention: torch.Tensor  # the same for each block's attention output
    mlp: torch.Tensor  # and its MLP output
    p_clean: float  # the answer's probability after the clean prompt
    p_corrupted: float  # and after the corrupted one (averaged over the noise samples)
    answer: str  # the answer token, printable
    noised: list[int]  # the positions that got noise (none where a corrupted prompt was given)

    def as_json(self) -> dict:
        return {"tokens": self.tokens, "layers": self.layers, "grid": self.grid.tolist(),
                "attention": self.attention.tolist(), "mlp": self.mlp.tolist(), "p_clean": self.p_clean,
                "p_corrupted": self.p_corrupted, "answer": self.answer, "noised": self.noised}

    @classmethod
    def from_json(cls, data: dict) -> "Trace":
        return cls(**{**data, **{name: torch.tensor(data[name]) for name in ("grid", "attention", "mlp")}})


def span_positions(tokenizer: Tokenizer, ids: list[int], span: str) -> list[int]:
    """The positions of the tokens that hold any of `span`'s first occurrence in the prompt `ids`
    spell, or a Refusal where it is not there."""
    spelled, wanted = b"".join(tokenizer.token_bytes(id) for id in ids), span.encode("utf-8")
    start = spelled.find(wanted) if wanted.strip() else -1
    if start < 0:
        raise Refusal("noise_span_missing", span=span)
    end, positions, offset = start + len(wanted), [], 0
    for position, id in enumerate(ids):
        length = len(tokenizer.token_bytes(id))
        if offset < end and offset + length > start:
            positions.append(position)
        offset += length
    return positions


def prompt_ids(tokenizer: Tokenizer, name: str, text: str, most: int) -> list[int]:
    ids = tokenizer.encode(text)
    if not ids:
        raise Refusal("empty", name=name)
    if len(ids) > most:
        raise Refusal("trace_tokens", name=name, tokens=len(ids), most=most)
    return ids


@torch.no_grad()
def trace(model: GPT2, tokenizer: Tokenizer, clean: str, corrupted: str = "", answer: str = "",
          noise_span: str = "", progress: Progress | None = None) -> Trace:
    """The trace of `clean` against `corrupted` (empty: noise on `noise_span`, a piece of the clean
    prompt), for `answer` (empty: the clean run's likeliest next token); progress(done, total)
    after each layer of each grid. Texts as checked_text passes them."""
    most = min(MAX_TOKENS, model.config.n_positions)
    clean_ids = prompt_ids(tokenizer, "clean prompt", clean, most)
    corrupted_ids, noised = None, []
    if corrupted:
        corrupted_ids = prompt_ids(tokenizer, "corrupted prompt", corrupted, most)
        if len(corrupted_ids) != len(clean_ids):
            raise Refusal("trace_lengths", clean=len(clean_ids), corrupted=len(corrupted_ids))
    elif noise_span:
        noised = span_positions(tokenizer, clean_ids, noise_span)
    else:
        raise Refusal("trace_no_corruption")
    answer_id = None
    if answer:
        answer_ids = tokenizer.encode(answer)
        if len(answer_ids) != 1:
            raise Refusal("answer_one_token", answer=answer, tokens=len(answer_ids))
        answer_id = answer_ids[0]
    patching = Patching(model, clean_ids, corrupted_ids, noised, answer_id, samples=NOISE_SAMPLES)
    if patching.p_clean == patching.p_corrupted:
        raise Refusal("trace_no_effect", answer=token_label(tokenizer, patching.answer),
                      probability=patching.p_clean)
    grids = patching.grids(progress)
    return Trace(tokens=[token_label(tokenizer, id) for id in clean_ids], layers=model.config.n_layer,
                 grid=grids["residual"], attention=grids["attention"], mlp=grids["mlp"],
                 p_clean=patching.p_clean, p_corrupted=patching.p_corrupted,
                 answer=token_label(tokenizer, patching.answer), noised=noised)

"""A look inside a loaded GPT-2 for one prompt: what the architecture tab's live view shows.

- the residual stream's norm at each token after the embeddings, after every block and after ln_f;
- one layer's attention probabilities for one head, computed from that layer's q and k (the model
  runs attention through SDPA, which never returns the probabilities);
- the ten likeliest next tokens;
- the logit lens: what each layer would predict, with an adapter on and where it changes that.

Works for any GPT2 (bundled, gpt2, ...), Pre-LN or Post-LN, with its adapters off (the lens can
switch one on).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.residual import recording_outputs, residual_stream
from model.gpt2 import GPT2
from model.tokenizer import Tokenizer
from tasks.messages import Refusal

MAX_TOKENS = 64  # more than this makes the attention map unreadable


@dataclass(frozen=True)
class Inspection:
    tokens: list[str]  # the prompt's tokens, printable
    residual_norms: torch.Tensor  # (n_layer + 2, tokens): embeddings, after each block, after ln_f
    attention: torch.Tensor  # (tokens, tokens): row i = how query i spreads over keys 0..i
    layer: int  # 0-based
    head: int  # 0-based
    top_tokens: list[tuple[str, float]]  # ten (token, probability), likeliest first


WHITESPACE_SHOWN = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def readable(text: str) -> str:
    """A token's text as a person can read it on its own (an axis, a list): its whitespace made
    visible."""
    return text.translate(WHITESPACE_SHOWN)


def as_text(data: bytes) -> str:
    """A token's bytes as text to show on their own. A piece of a character (byte-level tokens
    split them) shows its bytes, \\xf0\\x9f: as U+FFFD, every such piece looked the same."""
    return bytes(data).decode("utf-8", errors="backslashreplace")


def token_label(tokenizer: Tokenizer, id: int) -> str:
    """A token on an axis: readable, or its id where it has no text of its own."""
    return readable(as_text(tokenizer.token_bytes(id))) or f"<{id}>"


def attention_probabilities(c_attn_output: torch.Tensor, n_head: int, head: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(head_dim)) with the causal mask, for one head of one sequence.

    c_attn_output is that layer's q, k, v projection (time, 3 * n_embd), as Attention splits it.
    """
    q, k, _ = c_attn_output.float().chunk(3, dim=-1)
    head_dim = q.shape[-1] // n_head
    q, k = (t[:, head * head_dim:(head + 1) * head_dim] for t in (q, k))
    scores = q @ k.T / math.sqrt(head_dim)
    future = torch.ones_like(scores, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def live_view_ids(model: GPT2, tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The prompt's tokens, or a Refusal where it is empty or longer than a live view takes."""
    ids = tokenizer.encode(prompt)
    if not ids:
        raise Refusal("prompt_empty_tokens")
    most = min(MAX_TOKENS, model.config.n_positions)
    if len(ids) > most:
        raise Refusal("live_view_tokens", tokens=len(ids), most=most)
    return ids


@torch.no_grad()
def inspect_prompt(model: GPT2, tokenizer: Tokenizer, prompt: str, layer: int = 0, head: int = 0) -> Inspection:
    config = model.config
    if not 0 <= layer < config.n_layer or not 0 <= head < config.n_head:
        raise ValueError(f"this model has layers 1-{config.n_layer} and heads 1-{config.n_head}; "
                         f"got layer {layer + 1}, head {head + 1}")
    ids = live_view_ids(model, tokenizer, prompt)
    device = model.device
    batch = torch.tensor([ids], device=device)
    with recording_outputs([model.transformer.h[layer].attn.c_attn, model.transformer.ln_f]) as outputs:
        stream, logits = residual_stream(model, batch)
    qkv, final = outputs
    norms = torch.stack([h[0].float().norm(dim=-1) for h in (*stream, final)]).cpu()
    probabilities = logits[0, -1].float().softmax(-1)
    top = probabilities.topk(10)
    return Inspection(
        tokens=[token_label(tokenizer, id) for id in ids],
        residual_norms=norms,
        attention=attention_probabilities(qkv[0], config.n_head, head).cpu(),
        layer=layer, head=head,
        top_tokens=[(token_label(tokenizer, id), float(p)) for p, id in zip(top.values, top.indices.tolist())],
    )


@dataclass(frozen=True)
class LogitLens:
    """What each layer would predict (the logit lens): the tied head, after ln_f, applied to the
    residual stream after each block."""
    tokens: list[str]  # the prompt's tokens: the positions
    top_tokens: list[list[str]]  # (n_layer, positions): each layer's likeliest next token there
    probabilities: torch.Tensor  # (n_layer, positions): its probability
    changed: torch.Tensor | None  # (n_layer, positions): where the adapter changes the top-1 (None: no adapter)


def lens_logits(model: GPT2, ids: torch.Tensor) -> torch.Tensor:
    """(n_layer, time, vocab): ln_f and the head over the residual stream after each block; the
    last layer's are the model's own logits."""
    stream, _ = residual_stream(model, ids)
    return torch.cat([model.lm_head(model.transformer.ln_f(h)) for h in stream[1:]]).float()


@torch.no_grad()
def logit_lens(model: GPT2, tokenizer: Tokenizer, prompt: str, adapter: str | None = None) -> LogitLens:
    """The logit lens of `prompt`; with `adapter`, the adapter's lens, and where its top-1 differs
    from the base model's."""
    from model.adapters import active_adapter

    ids = live_view_ids(model, tokenizer, prompt)
    batch = torch.tensor([ids], device=model.device)
    base = lens_logits(model, batch).softmax(-1).max(-1)
    lens, changed = base, None
    if adapter is not None:
        with active_adapter(adapter):
            lens = lens_logits(model, batch).softmax(-1).max(-1)
        changed = (lens.indices != base.indices).cpu()
    return LogitLens(tokens=[token_label(tokenizer, id) for id in ids],
                     top_tokens=[[token_label(tokenizer, int(id)) for id in row] for row in lens.indices.tolist()],
                     probabilities=lens.values.cpu(), changed=changed)

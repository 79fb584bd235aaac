"""GPT-2 with Pre-Layer Normalization, written out in one file (after nanoGPT's model.py).

    h = wte[ids] + wpe[positions]
    for block in blocks:
        h = h + attn(ln_1(h))        # Pre-LN: normalise the input of each sub-block
        h = h + mlp(ln_2(h))
    logits = ln_f(h) @ wte.T         # final LayerNorm, then the head tied to the embedding

Parameter names follow Hugging Face's GPT2LMHeadModel (transformer.h.N.attn.c_attn, mlp.c_fc, ...)
so checkpoints and PEFT adapters map one to one. HF stores those projections as Conv1D with
weights [in, out]; here they are nn.Linear ([out, in]) and checkpoint.py transposes once.

A KV cache is optional and lives outside the model (engine/cache.py). The model asks two things
of it: `advance(attention_mask, batch, steps)` gives the positions of a call's new tokens and
the attention mask over every cached slot, and `update(layer, k, v)` stores a layer's new keys
and values and returns all of them.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPT2Config


class Attention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, mask=None, cache=None, layer: int = 0):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = self.attend(q, k, v, mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def attend(self, q, k, v, mask):
        """softmax(q k^T / sqrt(head_dim)) v; mask None means plain causal attention (or, for one
        new token, every cached key)."""
        is_causal = mask is None and k.shape[2] == q.shape[2] > 1
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(self.activation(self.c_fc(x)))

    def activation(self, x):
        return F.gelu(x, approximate="tanh")  # GPT-2's GELU is the tanh form


class Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, h, mask=None, cache=None, layer: int = 0):
        if self.pre_norm:
            h = h + self.attn(self.ln_1(h), mask, cache, layer)
            return h + self.mlp(self.ln_2(h))
        # Post-LN, the original Transformer block (for the comparison experiments): normalise after
        # each residual addition.
        h = self.ln_1(h + self.attn(h, mask, cache, layer))
        return self.ln_2(h + self.mlp(h))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.n_positions, config.n_embd),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon) if config.final_norm else nn.Identity(),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.tie_head()
        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def tie_head(self) -> None:
        """The output head is the token embedding's weight (GPT-2's tied head)."""
        self.lm_head.weight = self.transformer.wte.weight

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Parameters, the head counted once as wte (it is wte's weight, or a copy of it)."""
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith("lm_head."))

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache=None, last_only: bool = False) -> torch.Tensor:
        """Logits (batch, time, vocab). attention_mask (batch, time) marks real tokens (0 = left padding).

        With a cache, input_ids are the tokens after those already cached, and the cache is advanced.
        last_only gives the last position's logits alone (batch, 1, vocab): all that generation
        needs, and the head over a whole prompt is a large matmul.
        """
        B, T = input_ids.shape
        if cache is not None:
            positions, mask = cache.advance(attention_mask, B, T)
        else:
            positions, mask = prompt_positions(attention_mask, B, T, self.config.n_positions, input_ids.device)
        h = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        h = self.run_blocks(h, mask, cache)
        return self.lm_head(self.transformer.ln_f(h[:, -1:] if last_only else h))

    def run_blocks(self, h: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """The blocks in turn (engine/kernels.py runs a decode step's in one call)."""
        for i, block in enumerate(self.transformer.h):
            h = block(h, mask, cache, i)
        return h


def prompt_positions(attention_mask: torch.Tensor | None, B: int, T: int, n_positions: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions and attention mask of a call without a cache: padding takes no position (each
    row counts from its own first real token), and no mask is needed without padding."""
    if T > n_positions:
        raise ValueError(f"sequence of {T} tokens exceeds the context window of {n_positions}")
    slots = torch.arange(T, device=device)
    if attention_mask is None or bool(attention_mask.all()):
        return slots, None
    valid = attention_mask.bool()
    return (valid.cumsum(-1) - 1).clamp(min=0), causal_padding_mask(valid, slots.expand(B, T))


def causal_padding_mask(valid: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """(batch, 1, queries, slots): a query sees the slots up to its own that hold real tokens.

    Every query also sees itself, so a padding query never attends to nothing (which would make
    softmax NaN).
    """
    key_slots = torch.arange(valid.shape[1], device=valid.device)
    query_slots = query_slots[:, None, :, None]
    return ((key_slots <= query_slots) & valid[:, None, None, :]) | (key_slots == query_slots)

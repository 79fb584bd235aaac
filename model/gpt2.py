"""GPT-2 with Pre-Layer Normalization, written out in one file (after nanoGPT's model.py).

    h = wte[ids] + wpe[positions]
    for block in blocks:
        h = h + attn(ln_1(h))        # Pre-LN: normalise the input of each sub-block
        h = h + mlp(ln_2(h))
    logits = ln_f(h) @ wte.T         # final LayerNorm, then the head tied to the embedding

Parameter names follow Hugging Face's GPT2LMHeadModel (transformer.h.N.attn.c_attn, mlp.c_fc, ...)
so checkpoints and PEFT adapters map one to one. HF stores those projections as Conv1D with
weights [in, out]; here they are nn.Linear ([out, in]) and checkpoint.py transposes once.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPT2Config


class KVCache:
    """Preallocated keys and values for every layer, plus which cached positions hold real tokens.

    Rows of a batch share one write position; prompts of different lengths are left-padded and
    their padding is masked out through `valid`.
    """

    def __init__(self, config: GPT2Config, batch_size: int, max_len: int, device=None, dtype=None):
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.length = 0  # positions filled so far
        self.max_len = max_len

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys/values for one layer; return everything cached so far."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class Attention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, mask=None, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.append(layer, k, v)
        # mask=None means plain causal attention over a prompt with no padding and no cache.
        is_causal = mask is None and k.shape[2] == T and T > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, h, mask=None, cache=None, layer=0):
        if self.pre_norm:
            h = h + self.attn(self.ln_1(h), mask, cache, layer)
            return h + self.mlp(self.ln_2(h))
        # Post-LN, the original Transformer block: normalise after each residual addition.
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
        self.lm_head.weight = self.transformer.wte.weight  # tied output head
        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        p = self.transformer.wte.weight
        return KVCache(self.config, batch_size, max_len or self.config.n_positions, p.device, p.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits (batch, time, vocab). attention_mask (batch, time) marks real tokens (0 = left padding).

        With a cache, input_ids are the tokens after those already cached, and the cache is advanced.
        """
        B, T = input_ids.shape
        past = cache.length if cache is not None else 0
        limit = min(self.config.n_positions, cache.max_len) if cache is not None else self.config.n_positions
        if past + T > limit:
            raise ValueError(f"sequence of {past + T} tokens exceeds the context window of {limit}")
        new_valid = (torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
                     if attention_mask is None else attention_mask.bool())
        if cache is not None:
            cache.valid[:, past:past + T] = new_valid
            valid = cache.valid[:, :past + T]
        else:
            valid = new_valid
        # Padding takes no position: each row counts positions from its own first real token.
        positions = (valid.cumsum(-1) - 1).clamp(min=0)[:, past:]
        mask = None
        if not bool(valid.all()):
            key_pos = torch.arange(past + T, device=input_ids.device)
            query_pos = key_pos[past:, None]
            # Causal and not padding; every position may see itself so a padded row never
            # attends to nothing (which would make softmax NaN).
            mask = ((key_pos <= query_pos) & valid[:, None, None, :]) | (key_pos == query_pos)
        elif past > 0 and T > 1:
            key_pos = torch.arange(past + T, device=input_ids.device)
            mask = key_pos <= key_pos[past:, None]

        h = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for i, block in enumerate(self.transformer.h):
            h = block(h, mask, cache, i)
        if cache is not None:
            cache.length += T
        return self.lm_head(self.transformer.ln_f(h))

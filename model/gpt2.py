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

from . import kernels
from .kernels import LoraUpdate
from .config import GPT2Config
from .quantize import Int8Linear


class KVCache:
    """Preallocated keys and values for every layer, filled slot by slot.

    Each row has its own fill level (`lengths`), so rows that joined at different times can
    decode in one batch (see model/scheduler.py). `valid` marks the filled slots that hold real
    tokens rather than left padding, and `positions` counts each row's real tokens: the
    position its next token takes. A forward call over B rows uses the cache's first B rows.
    """

    def __init__(self, config: GPT2Config, batch_size: int, max_len: int, device=None, dtype=None):
        max_len = min(max_len, config.n_positions)  # no position beyond the context window
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        # Zeros, not torch.empty: a masked-out slot still enters attention with weight 0, and
        # 0 * NaN from uninitialised memory would be NaN.
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.lengths = [0] * batch_size  # slots filled in each row; Python ints, so no device sync to read
        self.max_len, self.n_positions = max_len, config.n_positions
        self.has_padding = False
        # Set by advance() for one forward call: the rows and slots it writes (slices where every
        # row writes the same ones), and the slots it attends.
        self._rows, self._slots, self._end = slice(None), slice(0, 0), 0

    def advance(self, new_valid: torch.Tensor | None, batch: int, steps: int) -> torch.Tensor:
        """Take the next `steps` slots of the first `batch` rows for one forward call.

        new_valid (batch, steps) marks real tokens (None: all real). Returns the new tokens'
        positions; attention_mask() gives the call's mask, where one is needed.
        """
        lengths = self.lengths[:batch]
        self._end = max(lengths) + steps
        if self._end > self.max_len:
            raise ValueError(f"sequence of {self._end} tokens exceeds the context window of {self.max_len}")
        device = self.valid.device
        if new_valid is None:  # all real tokens
            positions = self.positions[:batch, None] + torch.arange(steps, device=device)
            self.positions[:batch] += steps
            new_valid = True
        else:
            self.has_padding = self.has_padding or not bool(new_valid.all())
            # Padding takes no position: each row counts positions from its own first real token.
            positions = self.positions[:batch, None] + (new_valid.cumsum(-1) - 1).clamp(min=0)
            self.positions[:batch] += new_valid.sum(-1)
        start = lengths[0]
        if all(n == start for n in lengths):  # every row writes the same slots: plain slicing
            self._rows, self._slots = slice(None, batch), slice(start, self._end)
        else:
            self._rows = torch.arange(batch, device=device)[:, None]
            self._slots = torch.tensor(lengths, device=device)[:, None] + torch.arange(steps, device=device)
        self.valid[self._rows, self._slots] = new_valid
        self.lengths[:batch] = [n + steps for n in lengths]
        return positions

    def attention_mask(self) -> torch.Tensor | None:
        """The attention mask of the call advance() set up (batch, 1, steps, slots), or None when
        plain causal attention over the filled slots will do. Built on demand: a decode step of
        rows at different lengths without padding runs on the kernels, which take each row's
        causal mask from its slot (kernels.decode_blocks), and building and reading it cost about
        5% of the bundled model's 8-row step (1.21 against 1.15 ms, docs/performance.md)."""
        if isinstance(self._slots, slice):  # every row writes the same slots
            start, steps = self._slots.start, self._end - self._slots.start
            if not self.has_padding and (steps == 1 or start == 0):
                return None  # one new token sees every filled slot; a fresh prompt is plain causal
            query_slots = torch.arange(start, self._end, device=self.valid.device).expand(self._rows.stop, steps)
        else:
            query_slots = self._slots  # (batch, steps): each row's own
        return causal_padding_mask(self.valid[:query_slots.shape[0], :self._end], query_slots)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's keys/values (batch, head, steps, dim) for one layer; return every filled slot."""
        keys, values = self.keys[layer], self.values[layer]
        if isinstance(self._slots, slice):
            keys[self._rows, :, self._slots] = k
            values[self._rows, :, self._slots] = v
        else:  # per-row slots: advanced indexing puts the (batch, steps) index dims first
            keys[self._rows, :, self._slots] = k.transpose(1, 2)
            values[self._rows, :, self._slots] = v.transpose(1, 2)
        batch = k.shape[0]
        return keys[:batch, :, :self._end], values[:batch, :, :self._end]

    def last_slots(self, batch: int) -> tuple[list[int], int]:
        """After advance() for one token per row: the slot each of the first `batch` rows wrote,
        and the number of slots that call attends."""
        return [n - 1 for n in self.lengths[:batch]], self._end

    def grow(self, max_len: int) -> None:
        """Room for max_len slots per row (at most the context window), keeping what is filled:
        a batch's cache starts as long as its requests need, not as long as the context. Old and
        new tensors coexist while it copies, so past half the context it goes to the whole of it
        at once rather than copying a large cache again soon after."""
        if max_len <= self.max_len:
            return
        max_len = self.n_positions if max_len > self.n_positions // 2 else max_len
        filled = max(self.lengths)
        keys, values = (old.new_zeros(*old.shape[:3], max_len, old.shape[4]) for old in (self.keys, self.values))
        valid = self.valid.new_zeros(self.valid.shape[0], max_len)  # all allocated before any is replaced
        for new, old in ((keys, self.keys), (values, self.values)):
            new[:, :, :, :filled] = old[:, :, :, :filled]
        valid[:, :filled] = self.valid[:, :filled]
        self.keys, self.values, self.valid, self.max_len = keys, values, valid, max_len

    def copy_row(self, row: int, source: "KVCache", source_row: int = 0) -> None:
        """Make row `row` a copy of `source`'s row `source_row`: a request joining a running batch,
        or moving into the row of one that left."""
        n = source.lengths[source_row]
        self.keys[:, row, :, :n] = source.keys[:, source_row, :, :n]
        self.values[:, row, :, :n] = source.values[:, source_row, :, :n]
        self.valid[row] = False
        self.valid[row, :n] = source.valid[source_row, :n]
        self.positions[row] = source.positions[source_row]
        self.lengths[row] = n
        self.has_padding = self.has_padding or source.has_padding


def causal_padding_mask(valid: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """(batch, 1, queries, slots): a query sees the slots up to its own that hold real tokens.

    Every query also sees itself, so a padding query never attends to nothing (which would make
    softmax NaN).
    """
    key_slots = torch.arange(valid.shape[1], device=valid.device)
    query_slots = query_slots[:, None, :, None]
    return ((key_slots <= query_slots) & valid[:, None, None, :]) | (key_slots == query_slots)


def as_written_params(blocks: nn.Module) -> tuple[list[torch.Tensor | None], list[LoraUpdate]] | None:
    """The blocks' parameters in the order kernels.decode_blocks takes them, and the adapter
    updates their hooks would add now; or None where one call would not compute what the modules
    would: a module of another type (a PEFT wrapper, say) or with a forward of its own, or a hook
    other than an adapter's (model/adapters.py says what its hook would add, as pending_updates).

    The order is each block's ln_1, c_attn, c_proj, ln_2, c_fc, c_proj (weight, bias, and for
    the projections an int8 scale): the modules' order of registration, which is their order of
    computation. One walk by hand, through the modules' own dicts rather than nn.Module's
    attribute lookups: it runs before every decode step, where looking the parameters up by name
    cost 0.25 ms on the bundled model."""
    stack, params, updates, projection = [blocks], [], [], 0
    while stack:
        module = stack.pop()
        kind = type(module)
        if kind not in AS_WRITTEN or "forward" in module.__dict__ or module._forward_pre_hooks:
            return None
        is_projection = kind in (Linear, Int8Linear)
        for hook in module._forward_hooks.values():
            pending = getattr(hook, "pending_updates", None)
            adds = None if pending is None else pending()
            if adds is None or (adds and not is_projection):
                return None
            updates += ((projection, *update) for update in adds)
        if kind is nn.LayerNorm:
            params += (module._parameters["weight"], module._parameters["bias"])
        elif is_projection:  # an Int8Linear without bias holds None outside _parameters
            params += (module._parameters["weight"], module._parameters.get("bias"), module._buffers.get("scale"))
            projection += 1
        stack.extend(reversed(module._modules.values()))  # in order of registration
    return params, updates


class Linear(nn.Linear):
    """nn.Linear whose decode steps (a few rows, no gradients) run on the decode kernels of
    model/kernels.py, which read the weights about twice as fast as MKL on a CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = kernels.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) if y is None else y


class Attention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one projection
        self.c_proj = Linear(config.n_embd, config.n_embd)

    def forward(self, x, mask=None, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.write(layer, k, v)
        y = kernels.decode_attention(q, k, v, mask)
        if y is None:
            # mask=None means plain causal attention over a prompt with no padding and no cache.
            is_causal = mask is None and k.shape[2] == T and T > 1
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        h = self.c_fc(x)
        if x.shape[0] > 1 and x.is_cpu and not torch.is_grad_enabled():
            # A batch row at a time, as that row would run alone: PyTorch's elementwise loop runs the
            # last elements of a call (past its last whole pair of vectors, and likewise of each
            # thread's share of a long call) through scalar code whose tanh rounds differently. For
            # a width that is not a multiple of 32 those are the end of a row alone but the middle
            # of a batch, so a row's GELU could depend on the rows around it (prompts prefilled
            # together, model/scheduler.py). It costs a few microseconds a call.
            return self.c_proj(torch.cat([F.gelu(row, approximate="tanh") for row in h.split(1)]))
        return self.c_proj(F.gelu(h, approximate="tanh"))


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
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
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
        # The head is tied to wte, or (int8, see model/quantize.py) a copy of it: counted once, as wte.
        return sum(p.numel() for name, p in self.named_parameters() if not name.startswith("lm_head."))

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        return KVCache(self.config, batch_size, self.config.n_positions if max_len is None else max_len, self.device,
                       self.transformer.wte.weight.dtype)

    def one_call_params(self, h: torch.Tensor) -> tuple[list[torch.Tensor | None], list[LoraUpdate]] | None:
        """The blocks' parameters and adapter updates where this decode step may run them in one
        call to the kernels (kernels.decode_blocks: the modules' bits without Python's part of the
        step, 29.6 -> 28.3 ms on GPT-2 small, docs/performance.md); otherwise None. It may for
        Pre-LN, fp32 on a CPU, no autograd, no more rows than the kernels' products take, and
        blocks that run as written here (as_written_params)."""
        if (self.config.norm_position != "pre" or not h.is_cpu or h.dtype != torch.float32
                or torch.is_grad_enabled() or h.shape[0] > kernels.KERNEL_ROWS
                or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks):
            return None
        return as_written_params(self.transformer.h)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, last_only: bool = False) -> torch.Tensor:
        """Logits (batch, time, vocab). attention_mask (batch, time) marks real tokens (0 = left padding).

        With a cache, input_ids are the tokens after those already cached, and the cache is advanced.
        last_only gives the last position's logits alone (batch, 1, vocab): all that generation
        needs, and the head over a whole prompt is a large matmul.
        """
        B, T = input_ids.shape
        new_valid = None if attention_mask is None else attention_mask.bool()
        mask = None
        if cache is not None:
            positions = cache.advance(new_valid, B, T)
        else:
            if T > self.config.n_positions:
                raise ValueError(f"sequence of {T} tokens exceeds the context window of {self.config.n_positions}")
            positions = torch.arange(T, device=input_ids.device)
            if new_valid is not None and not bool(new_valid.all()):
                positions = (new_valid.cumsum(-1) - 1).clamp(min=0)
                mask = causal_padding_mask(new_valid, torch.arange(T, device=input_ids.device).expand(B, T))

        h = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        one_call = self.one_call_params(h) if cache is not None and T == 1 else None
        fused = None
        if one_call is not None:
            slots, end = cache.last_slots(B)
            # Without padding, each row's mask is its slots up to its own, which the kernels take from `slots`.
            mask = cache.attention_mask() if cache.has_padding else None
            fused = kernels.decode_blocks(h, *one_call, self.config.layer_norm_epsilon, self.config.n_head,
                                          cache.keys, cache.values, slots, end, mask)
        if fused is not None:
            h = fused
        else:
            if cache is not None and mask is None:  # not built for the kernels
                mask = cache.attention_mask()
            for i, block in enumerate(self.transformer.h):
                h = block(h, mask, cache, i)
        return self.lm_head(self.transformer.ln_f(h[:, -1:] if last_only else h))


# The modules whose calls kernels.decode_blocks stands in for (as_written_params).
AS_WRITTEN = frozenset({nn.ModuleList, Block, Attention, MLP, nn.LayerNorm, Linear, Int8Linear})

"""The KV cache for rows of different lengths: what the model's cache hook (model/gpt2.py) runs on.

Keys and values for every layer are preallocated and filled slot by slot. Each row has its own
fill level, so requests that joined a running batch at different times decode in one step
(engine/scheduler.py); the batch's cache grows as the admitted requests need, and a request's
row is copied in when it joins and moved when another leaves.
"""
from __future__ import annotations

import torch

from model.config import GPT2Config
from model.gpt2 import GPT2, causal_padding_mask


def new_cache(model: GPT2, batch_size: int, max_len: int | None = None) -> "KVCache":
    """An empty cache for `batch_size` rows of `model`, at most max_len slots each (the context)."""
    config = model.config
    return KVCache(config, batch_size, config.n_positions if max_len is None else max_len, model.device,
                   model.transformer.wte.weight.dtype)


class KVCache:
    """Preallocated keys and values for every layer, filled slot by slot.

    Each row has its own fill level (`lengths`), so rows that joined at different times can
    decode in one batch (see engine/scheduler.py). `valid` marks the filled slots that hold real
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
        self._one_token_slots: torch.Tensor | None = None

    def advance(self, attention_mask: torch.Tensor | None, batch: int,
                steps: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Take the next `steps` slots of the first `batch` rows for one forward call.

        attention_mask (batch, steps) marks real tokens (None: all real). Returns the new tokens'
        positions and the call's attention mask (None where plain attention will do).
        """
        new_valid = None if attention_mask is None else attention_mask.bool()
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
        self._one_token_slots = None
        return positions, self.attention_mask()

    def attention_mask(self) -> torch.Tensor | None:
        """The attention mask of the call advance() set up (batch, 1, steps, slots), or None when
        plain causal attention over the filled slots will do."""
        if isinstance(self._slots, slice):  # every row writes the same slots
            start, steps = self._slots.start, self._end - self._slots.start
            if not self.has_padding and (steps == 1 or start == 0):
                return None  # one new token sees every filled slot; a fresh prompt is plain causal
            query_slots = torch.arange(start, self._end, device=self.valid.device).expand(self._rows.stop, steps)
        else:
            query_slots = self._slots  # (batch, steps): each row's own
        return causal_padding_mask(self.valid[:query_slots.shape[0], :self._end], query_slots)

    def one_token_slots(self) -> tuple[torch.Tensor, int]:
        """For a call of one token per row that advance() set up: the slot each row's token goes to
        (batch,), and how many slots the call attends. The decode kernels' whole block
        (engine/kernels.py) writes the keys and values there itself, as update() would."""
        if self._one_token_slots is None:  # once per call, for every layer
            if isinstance(self._slots, slice):
                slots = torch.full((self._rows.stop,), self._slots.start, dtype=torch.long)
            else:
                slots = self._slots[:, 0].to("cpu", torch.long)
            self._one_token_slots = slots.contiguous()
        return self._one_token_slots, self._end

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


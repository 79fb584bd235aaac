"""Language-modelling metrics that compare models with different tokenizers."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from model.tokenizer import Tokenizer


@torch.no_grad()
def bits_per_byte(model: nn.Module, tokenizer: Tokenizer, text: str, stride: int | None = None,
                  batch_size: int = 8, progress: bool = False) -> float:
    """Total next-token negative log-likelihood of `text` in bits, divided by its UTF-8 bytes.

    Per-token loss depends on how much text a token holds; per byte it does not, so models with
    different tokenizers compare. The text is read in windows of the model's context that start
    `stride` tokens apart (default: half the context), each scoring only the tokens no earlier
    window scored, so every token after the first window has at least context - stride tokens
    of context. The text is preceded by the end-of-text token, as a document is in training, so
    that its first token is scored too and the bits cover every byte. `progress` shows a bar
    over the windows (tqdm).
    """
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError("text is empty")
    if tokenizer.decode(ids) != text:
        # Bits would then be counted for some other text than the bytes they are divided by.
        raise ValueError(f"the {tokenizer.name} tokenizer does not encode this text reversibly; bits per byte "
                         "would not be measured on the text itself")
    n_ctx = model.config.n_positions
    stride = stride or max(1, n_ctx // 2)
    if not 1 <= stride <= n_ctx:
        raise ValueError(f"stride must be between 1 and the context ({n_ctx}), got {stride}")
    tokens = torch.tensor([tokenizer.eos_id] + ids)
    last_target = len(tokens) - 1  # targets are tokens[1:], each predicted from the tokens before it

    # (begin, end, scored): inputs tokens[begin:end], targets tokens[begin + 1:end + 1], of which the last `scored`
    windows, scored_until = [], 0
    for begin in range(0, last_target, stride):
        end = min(begin + n_ctx, last_target)
        windows.append((begin, end, end - scored_until))
        scored_until = end
        if end == last_target:
            break

    device = next(model.parameters()).device
    nats = 0.0
    for start in tqdm(range(0, len(windows), batch_size), desc="bits per byte", unit="batch", disable=not progress,
                      leave=False, dynamic_ncols=True):
        batch = windows[start:start + batch_size]
        width = max(end - begin for begin, end, _ in batch)
        # Right padding (with target index 0, never read) keeps each row's real tokens exact.
        x = torch.zeros(len(batch), width, dtype=torch.long)
        y = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (begin, end, _) in enumerate(batch):
            x[row, :end - begin] = tokens[begin:end]
            y[row, :end - begin] = tokens[begin + 1:end + 1]
        log_probs = F.log_softmax(model(x.to(device)).float(), dim=-1)
        token_log_probs = log_probs.gather(-1, y.to(device)[..., None])[..., 0].double()
        for row, (begin, end, scored) in enumerate(batch):
            length = end - begin
            nats -= token_log_probs[row, length - scored:length].sum().item()
    return nats / math.log(2) / len(text.encode("utf-8"))

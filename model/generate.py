"""Generation: one token loop over the KV cache, used by every task and by batch callers.

`decode_tokens` is the loop (batched, per-row random generators, transformers' logits
processors); `stream` turns it into text deltas for one prompt, with stop strings, cancel and
a final `Result` that says how to reproduce the run.
"""
from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers import (LogitsProcessorList, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from .adapters import active_adapter, check_adapter
from .gpt2 import GPT2
from .tokenizer import Tokenizer

MAX_SEED = 2**32 - 1
# (lowest, highest) accepted value of each numeric setting; the UI builds its sliders from these.
LIMITS = {
    "temperature": (0.0, 5.0),
    "top_k": (0, 1000),
    "top_p": (0.01, 1.0),
    "repetition_penalty": (0.5, 3.0),
    "no_repeat_ngram_size": (0, 10),
    "max_new_tokens": (1, 2048),
    "seed": (0, MAX_SEED),
}
MAX_STOP_STRINGS, MAX_STOP_LENGTH = 8, 100


class ContextLengthError(ValueError):
    """The prompt does not fit in the model's context window."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1 means off
    repetition_penalty: float = 1.0  # 1 means off
    no_repeat_ngram_size: int = 0  # 0 means off
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None  # None: a random seed, reported back in the Result

    def __post_init__(self):
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if value is None and name == "seed":
                continue
            is_int = name in ("top_k", "no_repeat_ngram_size", "max_new_tokens", "seed")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be {'an integer' if is_int else 'a number'}, got {value!r}")
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{name} must be between {low} and {high}, got {value}")
            if is_int and value != int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if is_int:
                object.__setattr__(self, name, int(value))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in stop):
            raise ValueError(f"stop must be at most {MAX_STOP_STRINGS} non-empty strings "
                             f"of at most {MAX_STOP_LENGTH} characters")
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def logits_processors(self) -> LogitsProcessorList:
        """transformers' own, well-tested implementations of each setting."""
        processors = LogitsProcessorList()
        if self.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.no_repeat_ngram_size > 0:
            processors.append(NoRepeatNGramLogitsProcessor(self.no_repeat_ngram_size))
        if not self.greedy:
            if self.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k > 0:
                processors.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
        return processors


@dataclass
class Chunk:
    text: str  # text generated since the previous chunk


@dataclass
class Result:
    text: str  # the whole generated text, stop string cut off
    seed: int
    prompt_tokens: int
    generated_tokens: int
    tokens_per_second: float
    stop_reason: str  # "eos" | "stop_string" | "max_tokens" | "context_full" | "cancelled" (tasks add "task_done")
    token_ids: list[int] = field(default_factory=list)

    def summary(self) -> str:
        return (f"seed {self.seed} · {self.prompt_tokens} prompt + {self.generated_tokens} generated tokens · "
                f"{self.tokens_per_second:.1f} tokens/s · stopped: {self.stop_reason}")


def resolve_seed(seed: int | None) -> int:
    return random.SystemRandom().randint(0, MAX_SEED) if seed is None else seed


def check_prompt_fits(model: GPT2, prompt_length: int) -> None:
    n_ctx = model.config.n_positions
    if prompt_length == 0:
        raise ValueError("the prompt is empty")
    if prompt_length >= n_ctx:
        raise ContextLengthError(f"the prompt is {prompt_length} tokens; the context window is {n_ctx} "
                                 "tokens and at least one must be left to generate")


@torch.inference_mode()
def decode_tokens(model: GPT2, prompts: list[list[int]], params: SamplingParams, seeds: list[int],
                  pad_id: int = 0, adapter: str | None = None) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, step after step, until the context is full.

    Prompts of different lengths are left-padded. Each row samples with its own generator, so a
    seeded row gives the same tokens alone or in a batch. `adapter` names the LoRA adapter to run
    with (None: the base model). The caller decides when to stop; closing this generator frees the
    cache at once.
    """
    check_adapter(model, adapter)
    device = model.transformer.wte.weight.device
    for p in prompts:
        check_prompt_fits(model, len(p))
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device, dtype=torch.bool)
    generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    processors = params.logits_processors()
    budget = min(params.max_new_tokens, model.config.n_positions - width)
    cache = model.new_cache(len(prompts), width + budget)
    try:
        with active_adapter(adapter):
            logits = model(ids, attention_mask=mask, cache=cache)[:, -1]
        histories = [torch.tensor([p], device=device) for p in prompts]
        for step in range(budget):
            # Processors see each row's own tokens, never the padding, so a row is the same alone
            # or in a batch also with a repetition penalty or a no-repeat n-gram size.
            scores = torch.cat([processors(h, logits[i:i + 1].float()) for i, h in enumerate(histories)])
            if params.greedy:
                next_tokens = scores.argmax(dim=-1)
            else:
                probs = torch.softmax(scores, dim=-1)
                next_tokens = torch.cat([torch.multinomial(probs[i], 1, generator=g)
                                         for i, g in enumerate(generators)])
            yield next_tokens
            histories = [torch.cat([h, t.view(1, 1)], dim=1) for h, t in zip(histories, next_tokens)]
            if step + 1 < budget:
                with active_adapter(adapter):
                    logits = model(next_tokens[:, None], cache=cache)[:, -1]
    finally:
        del cache


def stream(model: GPT2, tokenizer: Tokenizer, prompt: str | list[int], params: SamplingParams,
           cancel: threading.Event | None = None, adapter: str | None = None) -> Iterator[Chunk | Result]:
    """Yield Chunks of new text as tokens arrive, then one Result.

    Text that could be the start of a stop string is held back until it is known not to be one,
    so a stop string is never shown, even when it spans several tokens.
    """
    prompt_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    check_prompt_fits(model, len(prompt_ids))
    seed = resolve_seed(params.seed)
    decoder = tokenizer.stream_decoder()
    text, shown, generated = "", 0, []
    stop_reason = "context_full" if len(prompt_ids) + params.max_new_tokens > model.config.n_positions else "max_tokens"
    start = time.perf_counter()
    tokens = decode_tokens(model, [prompt_ids], params, [seed], pad_id=tokenizer.eos_id, adapter=adapter)
    try:
        for next_tokens in tokens:
            if cancel is not None and cancel.is_set():
                stop_reason = "cancelled"
                break
            token = int(next_tokens[0])
            if token == tokenizer.eos_id:
                stop_reason = "eos"
                break
            generated.append(token)
            text += decoder.push(token)
            cut = find_stop(text, params.stop, shown)
            if cut is not None:
                text, stop_reason = text[:cut], "stop_string"
                break
            safe = len(text) - held_back(text, params.stop)
            if safe > shown:
                yield Chunk(text[shown:safe])
                shown = safe
    finally:
        tokens.close()  # frees the KV cache now, also when our caller closes us
    if stop_reason != "stop_string":
        text += decoder.flush()
    if len(text) > shown:
        yield Chunk(text[shown:])
    elapsed = time.perf_counter() - start
    yield Result(text=text, seed=seed, prompt_tokens=len(prompt_ids), generated_tokens=len(generated),
                 tokens_per_second=len(generated) / elapsed if elapsed > 0 else 0.0,
                 stop_reason=stop_reason, token_ids=generated)


def find_stop(text: str, stops: tuple[str, ...], shown: int) -> int | None:
    """Index of the earliest stop string in text; only the part not yet shown needs searching."""
    hits = [i for s in stops if (i := text.find(s, max(0, shown - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of text that is the beginning of a stop string."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                if s.startswith(text[-n:])), default=0)


def generate(model: GPT2, tokenizer: Tokenizer, prompt: str | list[int], params: SamplingParams,
             cancel: threading.Event | None = None, adapter: str | None = None) -> Result:
    """Run `stream` to the end and return its Result."""
    for event in stream(model, tokenizer, prompt, params, cancel, adapter):
        if isinstance(event, Result):
            return event
    raise AssertionError("stream ended without a Result")

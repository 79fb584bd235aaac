"""Generation: one token loop over the KV cache, used by every task and by batch callers.

`decode_tokens` is the loop (batched, one `Sampler` per row: transformers' logits processors and
the row's own random generator); `stream` turns the tokens of one prompt into text deltas, with
stop strings, cancel and a final `Result` that says how to reproduce the run. The tokens come
from `decode_tokens`, or from a `Scheduler` (engine/scheduler.py) that decodes many requests in
one batch.
"""
from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import torch
from transformers import (LogitsProcessor, MinPLogitsWarper, NoRepeatNGramLogitsProcessor,
                          RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
                          TypicalLogitsWarper)

from model.adapters import active_adapter, as_choice, check_adapter
from model.config import GPT2Config
from model.gpt2 import GPT2
from model.tokenizer import Tokenizer

from . import kernels
from .cache import KVCache, new_cache
from .steering import Steering, check_steering, steered

MAX_SEED = 2**32 - 1  # seeds are drawn from 0 to this
# Prompt tokens per forward call (prefill_chunk), about the most a newcomer's prompt stalls the
# other requests' streams between two steps: smaller chunks stall less but prefill more slowly,
# and prompts up to this length go in one call, as fast as ever.
PREFILL_CHUNK = 512
# Candidates beyond top_k that sampling takes from each row (pick_group), so that scores tied
# with the k-th highest, which the top-k warper keeps, come along.
TIE_ROOM = 8
# Sampling narrows to the candidates where they are at most this share of the vocabulary: past
# it, sorting the candidates costs more than it saves.
NARROW_SHARE = 64
DRAWS_AHEAD = 64  # random numbers a Sampler draws at once


FLOAT_SETTINGS = ("temperature", "top_p", "min_p", "typical_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "adapter_scale")


class ContextLengthError(ValueError):
    """The prompt of `tokens` tokens does not fit in the model's context window of `context`."""

    def __init__(self, tokens: int, context: int):
        super().__init__(f"the prompt is {tokens:,} tokens; the context window is {context:,} tokens and at least one "
                         "must be left to generate")
        self.tokens, self.context = tokens, context


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1 means off
    min_p: float = 0.0  # 0 means off; else drop tokens less likely than min_p times the likeliest
    typical_p: float = 1.0  # 1 means off; else keep the tokens nearest the expected surprise, up to this mass
    repetition_penalty: float = 1.0  # 1 means off
    presence_penalty: float = 0.0  # 0 means off; OpenAI's: see GeneratedTokenPenalty
    frequency_penalty: float = 0.0  # 0 means off; OpenAI's: see GeneratedTokenPenalty
    no_repeat_ngram_size: int = 0  # 0 means off
    max_new_tokens: int = 64
    min_new_tokens: int = 0  # the model's end of text cannot come before this many new tokens
    stop: tuple[str, ...] = ()
    seed: int | None = None  # None: a random seed, reported back in the Result
    adapter_scale: float = 1.0  # how much of an adapter's update to add: 0 the base model, 1 as trained
    logprobs: int = 0  # report each token's log-probability and this many alternatives (0: none)

    def __post_init__(self):
        # A slider or an API client sends temperature 2, not 2.0, and transformers' processors
        # refuse ints; a single stop string is a tuple of one.
        for name in FLOAT_SETTINGS:
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def reads_history(self) -> bool:
        """Whether a processor reads the sequence's tokens so far: such a row picks alone (Sampler)."""
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def logits_processors(self, prompt_length: int = 0) -> list[LogitsProcessor]:
        """transformers' own, well-tested implementations of each setting, in the order its
        generate() applies them (min_new_tokens is held back apart: see Sampler); the presence and
        frequency penalties, which transformers has not, beside the repetition penalty. The
        processors are given the sequence's tokens so far, of which the first `prompt_length` are
        its prompt (GeneratedTokenPenalty counts only those after it)."""
        processors = []
        if self.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.presence_penalty != 0.0 or self.frequency_penalty != 0.0:
            processors.append(GeneratedTokenPenalty(self.presence_penalty, self.frequency_penalty, prompt_length))
        if self.no_repeat_ngram_size > 0:
            processors.append(NoRepeatNGramLogitsProcessor(self.no_repeat_ngram_size))
        if not self.greedy:
            if self.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k > 0:
                processors.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
            if self.min_p > 0.0:
                processors.append(MinPLogitsWarper(self.min_p))
            if self.typical_p < 1.0:
                processors.append(TypicalLogitsWarper(self.typical_p))
        return processors


class GeneratedTokenPenalty(LogitsProcessor):
    """OpenAI's presence and frequency penalties: each token's score less frequency_penalty times
    the number of times it was generated so far, and less presence_penalty once it has been
    generated at all (negative values favour repeats).

    Only the tokens this request generated count, not its prompt (the first prompt_length of the
    tokens it is given), as OpenAI counts them and vLLM does: a summary must be free to copy the
    article's names, a reply the persona's words, and a prompt cut to fit the context would
    otherwise change the penalty with how much of it was kept. (The repetition penalty, as
    transformers has it, counts the prompt too.)
    """

    def __init__(self, presence_penalty: float, frequency_penalty: float, prompt_length: int):
        self.presence_penalty, self.frequency_penalty = presence_penalty, frequency_penalty
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_length:]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency_penalty * counts - self.presence_penalty * (counts > 0).to(scores.dtype)


class BatchDecoder(Protocol):
    """What `stream` decodes on besides the network itself: a Scheduler (engine/scheduler.py),
    which runs each request in one batch with others and yields its tokens as decode_tokens does."""
    config: GPT2Config

    def decode(self, prompt: list[int], params: SamplingParams, seed: int, adapter: str | None = None,
               trace: list | None = None, eos_id: int | None = None, steering: Steering | None = None,
               drawn_before: int = 0) -> Iterator[torch.Tensor]: ...


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
    # The tokens the text is made of: a stop string's own tokens, drawn (generated_tokens counts
    # them) but cut from the text, are not among them, nor in logprobs.
    token_ids: list[int] = field(default_factory=list)
    # With SamplingParams.logprobs: per generated token {"token", "bytes", "logprob", "id", "top": [{"token",
    # "bytes", "logprob", "id"}, ...]} (token_logprobs), the log-probabilities the token was drawn from,
    # after the decoding settings.
    logprobs: list[dict] = field(default_factory=list)


def prefill_chunk(model: GPT2, ids: torch.Tensor, cache: KVCache, start: int,
                  attention_mask: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
    """Feed the prompt's tokens from `start` into the cache, at most PREFILL_CHUNK of them; return
    where the next chunk starts and the logits (rows, vocab) of this chunk's last position.

    Prompts go in chunks so that the scheduler can run the other requests' decode steps between
    a long prompt's chunks rather than stall them for the whole prompt. `decode_tokens` cuts a
    prompt of its own at the same places, so it gives the same numbers on either path (a
    left-padded batch is cut at the same places of the padded width).
    """
    end = min(start + PREFILL_CHUNK, ids.shape[1])
    mask = None if attention_mask is None else attention_mask[:, start:end]
    return end, model(ids[:, start:end], attention_mask=mask, cache=cache, last_only=True)[:, -1]


def new_token_budget(max_new_tokens: int, prompt_length: int, n_positions: int) -> int:
    """How many tokens a prompt of this length gets: max_new_tokens, or what the context has left."""
    return min(max_new_tokens, n_positions - prompt_length)


def resolve_seed(seed: int | None) -> int:
    return random.SystemRandom().randint(0, MAX_SEED) if seed is None else seed


def check_prompt_fits(model: GPT2 | BatchDecoder, prompt_length: int) -> None:
    n_ctx = model.config.n_positions
    if prompt_length == 0:
        raise ValueError("the prompt is empty")
    if prompt_length >= n_ctx:
        raise ContextLengthError(prompt_length, n_ctx)


class Sampler:
    """How one sequence picks its next token: its settings, as transformers' logits processors,
    and its own random generator, so that a seeded sequence draws the same tokens alone or in
    any batch."""

    def __init__(self, params: SamplingParams, seed: int, device: torch.device, trace: list | None = None,
                 eos_id: int | None = None, prompt_length: int = 0):
        """`prompt_length`: how many of the tokens its history starts with are the prompt, which the
        presence and frequency penalties do not count."""
        self.greedy = params.greedy
        # With params.logprobs, each pick appends (token, its log-probability, [(alternative,
        # log-probability), ...]) here; None costs nothing.
        self.logprobs, self.trace = params.logprobs, trace if params.logprobs else None
        self.processors = params.logits_processors(prompt_length)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._uniforms: list[float] = []  # drawn ahead, next last
        # min_new_tokens: for this many more picks the end of text (the tokenizer's eos_id) cannot
        # come. Masked in the row's scores before its group's processors (pick_tokens), so the row
        # still picks with others; a processor reading the history would make it pick alone.
        self.eos_id, self.end_held_back = end_of_text(params, eos_id), params.min_new_tokens
        # Samplers with the same key pick together, through the first one's processors (see
        # pick_tokens): the key holds every setting those depend on. None: this one reads its
        # sequence's history (the penalties, n-gram blocking), so it picks alone.
        self.key = None if params.reads_history else (params.temperature, params.top_k, params.top_p,
                                                      params.min_p, params.typical_p)

    def uniform(self) -> float:
        """The next of this sequence's uniform random numbers in [0, 1), from its own generator.

        Drawn DRAWS_AHEAD at a time: on a CPU, the very numbers one draw at a time would give, in
        the same order, for one PyTorch call rather than one per token and row (a call in the
        scheduler's step costs 10-30 us, its caches cold after the forward)."""
        if not self._uniforms:
            self._uniforms = torch.rand(DRAWS_AHEAD, generator=self.generator,
                                        device=self.generator.device).tolist()[::-1]
        return self._uniforms.pop()

    def __call__(self, logits: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """The next token (shape (1,)) from this sequence's logits (1, vocab) and its tokens so far
        (1, n): the processors see the sequence's own tokens, never another row's or padding."""
        token = pick_tokens([self], logits, [history])[0]
        if isinstance(token, Exception):
            raise token
        return token


def end_of_text(params: SamplingParams, eos_id: int | None) -> int | None:
    """The end-of-text id a run with `params` holds back, checked: min_new_tokens needs it."""
    if params.min_new_tokens and eos_id is None:
        raise ValueError("min_new_tokens needs the end-of-text token's id (eos_id)")
    return eos_id


def without_end_of_text(logits: torch.Tensor, rows: list[int], eos_ids: list[int]) -> torch.Tensor:
    """A copy of `logits` (rows, vocab) in which each of `rows` cannot end the text (its eos_id's
    score -inf): how min_new_tokens holds the end back, in sampling and in scoring alike."""
    logits = logits.clone()
    logits[rows, eos_ids] = -math.inf
    return logits


def pick_tokens(samplers: list[Sampler], logits: torch.Tensor,
                histories: list[torch.Tensor]) -> list[torch.Tensor | Exception]:
    """The next token (shape (1,)) of each row of logits (rows, vocab), or the error its sampling
    raised (only the rows of that error's group fail; scores that are not finite fail their row).

    Rows whose samplers share a key run the processors, the softmax and the cumulative sum in one
    call, each row drawing with its own generator. On a CPU every step works row by row, so a row
    gets the same token as it does alone, in a call of one; one call instead of one per row is
    what makes sampling cheap for a batch. (On a GPU, a cumulative sum over one row and over
    several may add in different orders, as the matrix kernels do.)
    """
    held = [row for row, sampler in enumerate(samplers) if sampler.end_held_back]
    if held:
        logits = without_end_of_text(logits, held, [samplers[row].eos_id for row in held])
        for row in held:
            samplers[row].end_held_back -= 1
    groups: dict = {}
    for row, sampler in enumerate(samplers):
        groups.setdefault(("alone", row) if sampler.key is None else sampler.key, []).append(row)
    tokens: list = [None] * len(samplers)
    for rows in groups.values():
        sampler = samplers[rows[0]]
        history = histories[rows[0]] if len(rows) == 1 else None  # a shared key: no processor reads it
        try:
            group_logits = logits if len(rows) == len(samplers) else logits[rows]  # all rows: no copy
            picked = pick_group([samplers[row] for row in rows], group_logits, history)
        except Exception as error:  # these rows' settings or scores: they alone stop
            picked = [error] * len(rows)
        for row, token in zip(rows, picked):
            tokens[row] = token
    return tokens


def pick_group(samplers: list[Sampler], logits: torch.Tensor, history: torch.Tensor | None,
               narrow: bool = True) -> list[torch.Tensor | Exception]:
    """The tokens of rows whose samplers share their settings (the first one's), each drawn with
    its own sampler's random numbers.

    A sampled token is where one uniform number falls in the row's cumulative distribution;
    torch.multinomial would draw one exponential number per vocabulary entry (milliseconds per
    token for GPT-2's 50,257). A token of probability 0 takes no width in the
    cumulative sum, so it is never drawn.

    With top-k on, only each row's highest scores can be drawn, so from the top-k warper on (and
    from the temperature, which keeps the scores' order) the processors, the softmax and the
    cumulative sum run over those candidates (top_k + TIE_ROOM of them, in vocabulary order)
    rather than the whole vocabulary: the same distribution, and the same token for each draw up
    to the rounding of the softmax's sum, in about half the time. Not with
    top-p, whose sort breaks ties between equal scores differently over fewer of them (it is not
    stable), and not where the candidates are a large part of the vocabulary (narrows: their
    sort then costs more than it saves). A row where scores tied with the k-th could reach past
    the candidates (narrow=False) runs on the whole vocabulary, as every row did before; each
    row's way depends on its own scores alone, so it picks the same alone or in a crowd.
    """
    sampler = samplers[0]
    scores = logits.float()
    processors = sampler.processors  # not a LogitsProcessorList: it inspects each one's signature every call
    cut = next((i for i, p in enumerate(processors) if isinstance(p, TopKLogitsWarper)), len(processors))
    # The temperature keeps each row's order of scores (though unequal ones may become equal):
    # where it comes last before top-k, the candidates are taken before it, and it divides only them.
    select_at = cut - 1 if cut and isinstance(processors[cut - 1], TemperatureLogitsWarper) else cut
    narrowed = narrow and narrows(processors[cut:], scores.shape[1])
    for processor in processors[:select_at if narrowed else cut]:
        scores = processor(history, scores)
    vocabulary_ids = None  # where scores are each row's candidates: the token of each column
    if narrowed:
        top_k = processors[cut].top_k
        values, ids = scores.topk(top_k + TIE_ROOM)
        for processor in processors[select_at:cut]:
            values = processor(history, values)
        # Checked after the temperature, which may make scores equal. A NaN here spills too (a
        # NaN elsewhere fails the row below, as over the whole vocabulary).
        spills = [not fits for fits in (values[:, -1] < values[:, top_k - 1]).tolist()]
        if any(spills):
            return pick_rows_apart(samplers, logits, history, spills)
        vocabulary_ids, order = ids.sort(dim=-1)  # the order of the whole row's cumulative sum
        scores = values.gather(1, order)
    for processor in processors[cut:]:
        scores = processor(history, scores)
    if sampler.greedy:
        tokens = kernels.argmax(scores)
        if tokens is None:
            tokens = scores.argmax(dim=-1, keepdim=True)
        record_logprobs(samplers, scores, tokens, vocabulary_ids)
        return list(tokens if vocabulary_ids is None else vocabulary_ids.gather(1, tokens))
    cumulative = torch.softmax(scores, dim=-1).cumsum(dim=-1)
    totals = cumulative[:, -1:]
    finite = [0 < total < math.inf for total in totals[:, 0].tolist()]  # NaN fails this too
    # One draw per row that can be sampled (a failed row draws nothing, as alone), then one search for all.
    draws = torch.tensor([row.uniform() if ok else 0.0 for ok, row in zip(finite, samplers)],
                         dtype=totals.dtype, device=totals.device)
    tokens = torch.searchsorted(cumulative, draws[:, None] * totals, right=True).clamp_(max=cumulative.shape[1] - 1)
    record_logprobs(samplers, scores, tokens, vocabulary_ids)
    if vocabulary_ids is not None:
        tokens = vocabulary_ids.gather(1, tokens)
    return [token if ok else ValueError("the probabilities to sample from are not finite: the scores overflowed "
                                        "(a temperature too low for this model?)")
            for ok, token in zip(finite, tokens)]


def record_logprobs(samplers: list[Sampler], scores: torch.Tensor, tokens: torch.Tensor,
                    vocabulary_ids: torch.Tensor | None) -> None:
    """For the rows whose samplers keep a trace: the picked token's log-probability and the
    highest alternatives', from the scores it was drawn from (after every processor). `tokens`
    are columns of `scores`, which vocabulary_ids maps to token ids where they are candidates."""
    rows = [row for row, sampler in enumerate(samplers) if sampler.trace is not None]
    if not rows:
        return
    log_probs = torch.log_softmax(scores[rows].float(), dim=-1)
    for i, row in enumerate(rows):
        top_values, top_columns = log_probs[i].topk(min(samplers[row].logprobs, log_probs.shape[1]))
        ids = top_columns if vocabulary_ids is None else vocabulary_ids[row, top_columns]
        column = int(tokens[row, 0])
        token = column if vocabulary_ids is None else int(vocabulary_ids[row, column])
        alternatives = [(int(t), float(v)) for t, v in zip(ids, top_values) if v > -math.inf]
        samplers[row].trace.append((token, float(log_probs[i, column]), alternatives))


def narrows(processors: list[LogitsProcessor], vocabulary: int) -> bool:
    """Whether pick_group samples over each row's top-k candidates, given the processors from the
    top-k warper on (none: top-k is off)."""
    return (len(processors) == 1 and isinstance(processors[0], TopKLogitsWarper)
            and processors[0].top_k + TIE_ROOM <= vocabulary // NARROW_SHARE)


def pick_rows_apart(samplers: list[Sampler], logits: torch.Tensor, history: torch.Tensor | None,
                    spills: list[bool]) -> list[torch.Tensor | Exception]:
    """pick_group for rows some of which (spills) need the whole vocabulary: those on it, the
    others on their candidates."""
    tokens: list = [None] * len(spills)
    for narrow in (False, True):
        rows = [row for row, spill in enumerate(spills) if spill != narrow]
        if rows:
            picked = pick_group([samplers[row] for row in rows], logits[rows], history, narrow)
            for row, token in zip(rows, picked):
                tokens[row] = token
    return tokens


@torch.inference_mode()
def decode_tokens(model: GPT2, prompts: list[list[int]], params: SamplingParams, seeds: list[int],
                  pad_id: int = 0, adapter: str | None = None, traces: list[list] | None = None,
                  eos_id: int | None = None, steering: Steering | None = None,
                  drawn_before: int = 0) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, step after step, until the context is full.

    Prompts of different lengths are left-padded. Each row samples with its own generator, so a
    seeded row gives the same tokens alone or in a batch. `adapter` names the LoRA adapter to run
    with (None: the base model), at params.adapter_scale; `steering` steers every row
    (engine/steering.py). With params.logprobs, traces[row] gets each of that row's picks (Sampler).
    `drawn_before`: the last tokens of each prompt that this run drew before (a run continued from
    a chosen token), which the presence and frequency penalties count as generated.
    The caller decides when to stop; closing this generator frees the cache at once.
    """
    check_adapter(model, adapter)
    check_steering(model, steering)
    device = model.device
    for p in prompts:
        check_prompt_fits(model, len(p))
    width = max(len(p) for p in prompts)
    budget = new_token_budget(params.max_new_tokens, width, model.config.n_positions)
    # Every row's prompt and generated tokens, allocated once: a row's history is a view of it.
    tokens = torch.full((len(prompts), width + budget), pad_id, dtype=torch.long, device=device)
    starts = [width - len(p) for p in prompts]  # where each row's own tokens begin, after its padding
    for row, (start, p) in enumerate(zip(starts, prompts)):
        tokens[row, start:width] = torch.tensor(p)
    is_real = torch.arange(width, device=device) >= torch.tensor(starts, device=device)[:, None]
    samplers = [Sampler(params, seed, device, None if traces is None else traces[row], eos_id,
                        prompt_length=len(prompts[row]) - drawn_before) for row, seed in enumerate(seeds)]
    adapter = as_choice(adapter, params.adapter_scale)
    cache = new_cache(model, len(prompts), width + budget)
    try:
        with active_adapter(adapter), steered(model, steering):
            done = 0
            while done < width:
                done, logits = prefill_chunk(model, tokens[:, :width], cache, done, attention_mask=is_real)
        for end in range(width, width + budget):
            picked = pick_tokens(samplers, logits, [tokens[row:row + 1, start:end] for row, start in enumerate(starts)])
            for row, token in enumerate(picked):
                if isinstance(token, Exception):
                    raise token
                tokens[row, end] = token
            yield tokens[:, end]
            if end + 1 < width + budget:
                with active_adapter(adapter), steered(model, steering):
                    logits = model(tokens[:, end:end + 1], cache=cache)[:, -1]
    finally:
        del cache


def stream(model: GPT2 | BatchDecoder, tokenizer: Tokenizer, prompt: str | list[int], params: SamplingParams,
           cancel: threading.Event | None = None, adapter: str | None = None,
           steering: Steering | None = None, drawn_before: int = 0) -> Iterator[Chunk | Result]:
    """Yield Chunks of new text as tokens arrive, then one Result.

    `model` is the network itself, or a Scheduler that runs this request in one batch with others.
    Text that could be the start of a stop string is held back until it is known not to be one,
    so a stop string is never shown, even when it spans several tokens. `drawn_before`: as
    decode_tokens takes it.
    """
    prompt_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    check_prompt_fits(model, len(prompt_ids))
    seed = resolve_seed(params.seed)
    trace = [] if params.logprobs else None
    decoder = tokenizer.stream_decoder()
    text, shown, generated = "", 0, []
    written = None  # with a stop string: how many tokens its text is made of (the string's own are cut)
    ends: list[int] = []  # the text's length after each generated token
    budget = new_token_budget(params.max_new_tokens, len(prompt_ids), model.config.n_positions)
    stop_reason = "context_full" if budget < params.max_new_tokens else "max_tokens"
    start = time.perf_counter()
    if isinstance(model, GPT2):
        tokens = decode_tokens(model, [prompt_ids], params, [seed], pad_id=tokenizer.eos_id, adapter=adapter,
                               traces=None if trace is None else [trace], eos_id=tokenizer.eos_id, steering=steering,
                               drawn_before=drawn_before)
    else:
        tokens = model.decode(prompt_ids, params, seed, adapter=adapter, trace=trace, eos_id=tokenizer.eos_id,
                              steering=steering, drawn_before=drawn_before)
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
            ends.append(len(text))
            cut = find_stop(text, params.stop, shown)
            if cut is not None:
                text, stop_reason = text[:cut], "stop_string"
                written = next(i + 1 for i, end in enumerate(ends) if end >= cut) if cut else 0
                break
            safe = len(text) - held_back(text, params.stop)
            if safe > shown:
                yield Chunk(text[shown:safe])
                shown = safe
    finally:
        tokens.close()  # frees the KV cache (or the scheduler's row) now, also when our caller closes us
    if stop_reason != "stop_string":
        text += decoder.flush()
    if len(text) > shown:
        yield Chunk(text[shown:])
    elapsed = time.perf_counter() - start
    kept = generated[:written]  # [:None]: all of them
    yield Result(text=text, seed=seed, prompt_tokens=len(prompt_ids), generated_tokens=len(generated),
                 tokens_per_second=len(generated) / elapsed if elapsed > 0 else 0.0,
                 stop_reason=stop_reason, token_ids=kept,
                 logprobs=[] if trace is None else token_logprobs(tokenizer, trace[:len(kept)]))


def token_logprobs(tokenizer: Tokenizer, trace: list) -> list[dict]:
    """A Sampler's trace as Result.logprobs: each token as text, bytes and id, with its
    alternatives. The text of a piece of a character (byte-level tokens split emoji and CJK) is
    U+FFFD, so that the texts still join into the output; its bytes say which piece it is."""
    def described(id: int) -> dict:
        data = tokenizer.token_bytes(id)
        return {"token": data.decode("utf-8", errors="replace"), "bytes": list(data), "id": id}
    return [{**described(token), "logprob": logprob,
             "top": [{**described(other), "logprob": other_logprob} for other, other_logprob in alternatives]}
            for token, logprob, alternatives in trace]


@torch.inference_mode()
def score_tokens(model: GPT2, prompt: list[int], tokens: list[int], params: SamplingParams,
                 adapter: str | None = None, eos_id: int | None = None) -> list[float]:
    """Each token's log-probability after `prompt` and the tokens before it, under `model` with
    `adapter` at params.adapter_scale, through the same processors as sampling: what another
    setting of the adapter would have given the tokens a run drew (the compare view)."""
    if not tokens:
        return []
    ids = torch.tensor([prompt + tokens], device=model.device)
    with active_adapter(as_choice(adapter, params.adapter_scale)):
        logits = model(ids[:, :-1])[0, len(prompt) - 1:].float()
    processors, eos_id = params.logits_processors(len(prompt)), end_of_text(params, eos_id)
    held = list(range(min(params.min_new_tokens, len(tokens))))  # as a Sampler holds the end back
    if held:
        logits = without_end_of_text(logits, held, [eos_id] * len(held))
    scores = []
    for step, token in enumerate(tokens):
        row = logits[step:step + 1]
        for processor in processors:
            row = processor(ids[:, :len(prompt) + step], row)
        scores.append(float(torch.log_softmax(row, dim=-1)[0, token]))
    return scores


@torch.inference_mode()
def prompt_trace(model: GPT2, ids: list[int], top: int, adapter: str | None = None,
                 adapter_scale: float = 1.0) -> list[tuple[int, float | None, list[tuple[int, float]]]]:
    """Each prompt token's log-probability after the tokens before it, with the `top` likeliest
    tokens in its place, as a Sampler's trace (token_logprobs describes it): the model's own
    probabilities, before any decoding setting, as OpenAI's echo gives them. The first token
    follows nothing: it has none."""
    if len(ids) < 2:
        return [(token, None, []) for token in ids]
    x = torch.tensor([ids], device=model.device)
    with active_adapter(as_choice(adapter, adapter_scale)):
        logprobs = torch.log_softmax(model(x[:, :-1])[0].float(), dim=-1)
    chosen = logprobs.gather(1, x[0, 1:, None])[:, 0].tolist()
    best = logprobs.topk(top, dim=-1) if top else None
    return [(ids[0], None, [])] + [
        (token, chosen[i], list(zip(best.indices[i].tolist(), best.values[i].tolist())) if top else [])
        for i, token in enumerate(ids[1:])]


def find_stop(text: str, stops: tuple[str, ...], shown: int) -> int | None:
    """Index of the earliest stop string in text; only the part not yet shown needs searching."""
    hits = [i for s in stops if (i := text.find(s, max(0, shown - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of text that is the beginning of a stop string."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                if s.startswith(text[-n:])), default=0)


def generate(model: GPT2 | BatchDecoder, tokenizer: Tokenizer, prompt: str | list[int], params: SamplingParams,
             cancel: threading.Event | None = None, adapter: str | None = None,
             steering: Steering | None = None) -> Result:
    """Run `stream` to the end and return its Result."""
    for event in stream(model, tokenizer, prompt, params, cancel, adapter, steering):
        if isinstance(event, Result):
            return event
    raise AssertionError("stream ended without a Result")

"""The token loop: seeds, bounds, stop strings, cancel, context limits."""
from __future__ import annotations

import copy
import gc
import threading
import weakref
from dataclasses import replace

import pytest
import torch

from model import load_pretrained
from engine import generate as generate_module
from engine.generate import Chunk, ContextLengthError, Result, SamplingParams, generate, stream
from engine.scheduler import Scheduler
from tasks import TASKS, GenerateInputs, TaskDone, run_task


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint):
    return load_pretrained(tiny_checkpoint)


SAMPLED = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, repetition_penalty=1.2, no_repeat_ngram_size=3,
                         max_new_tokens=20)


def run(loaded, prompt="Once upon a time", params=SAMPLED, cancel=None):
    model, tokenizer = loaded
    events = list(stream(model, tokenizer, prompt, params, cancel))
    chunks, result = events[:-1], events[-1]
    assert all(isinstance(c, Chunk) for c in chunks) and isinstance(result, Result)
    assert "".join(c.text for c in chunks) == result.text  # the stream adds up to the result
    return chunks, result


def test_same_seed_same_text_and_reported_seed_reproduces(loaded):
    _, first = run(loaded, params=replace(SAMPLED, seed=123))
    _, again = run(loaded, params=replace(SAMPLED, seed=123))
    assert first.seed == 123 and again.token_ids == first.token_ids and len(first.token_ids) > 5
    _, other = run(loaded, params=replace(SAMPLED, seed=124))
    assert other.token_ids != first.token_ids
    _, unseeded = run(loaded)
    _, replay = run(loaded, params=replace(SAMPLED, seed=unseeded.seed))
    assert replay.token_ids == unseeded.token_ids
    assert replay.seed == unseeded.seed  # the seed a run reports is the one it ran with


def test_whole_number_float_settings_sample_like_their_floats(loaded):
    """A slider or an API client sends temperature 2, not 2.0: transformers' processors refuse
    ints, so the settings are floats by the time they reach them."""
    whole = SamplingParams(temperature=2, repetition_penalty=2, top_p=1, max_new_tokens=8, seed=5)
    assert isinstance(whole.temperature, float) and isinstance(whole.repetition_penalty, float)
    _, result = run(loaded, params=whole)
    _, floats = run(loaded, params=SamplingParams(temperature=2.0, repetition_penalty=2.0, max_new_tokens=8, seed=5))
    assert result.token_ids == floats.token_ids and len(result.token_ids) == 8


def test_stop_string_spanning_tokens_is_cut(loaded):
    model, tokenizer = loaded
    params = SamplingParams(temperature=0, max_new_tokens=24)
    _, free = run(loaded, params=params)
    pieces = [tokenizer.decode([t]) for t in free.token_ids]
    # A stop string made of the end of token 4 and the start of token 5 spans a token boundary.
    boundary = sum(len(p) for p in pieces[:5])
    assert len(pieces[4]) >= 1 and len(pieces[5]) >= 1
    stop = free.text[boundary - 1:boundary + 1]
    cut_at = free.text.find(stop)
    chunks, result = run(loaded, params=replace(params, stop=(stop,)))
    assert result.stop_reason == "stop_string"
    assert result.text == free.text[:cut_at]
    assert all(stop not in c.text for c in chunks)


def test_cancel_stops_within_one_token(loaded):
    model, tokenizer = loaded
    cancel = threading.Event()
    events = []
    for event in stream(model, tokenizer, "Hello", replace(SAMPLED, max_new_tokens=100, seed=1), cancel):
        events.append(event)
        cancel.set()
    result = events[-1]
    assert result.stop_reason == "cancelled" and result.generated_tokens <= 2


def test_closing_the_stream_frees_the_cache(loaded, monkeypatch):
    model, tokenizer = loaded
    caches = []
    new_cache = generate_module.new_cache
    monkeypatch.setattr(generate_module, "new_cache", lambda *a, **k: caches.append(c := new_cache(*a, **k)) or c)
    events = stream(model, tokenizer, "Hello", replace(SAMPLED, max_new_tokens=100))
    next(events)
    alive = weakref.ref(caches.pop())
    assert alive() is not None
    events.close()
    gc.collect()
    assert alive() is None


def test_context_limits(loaded):
    model, tokenizer = loaded
    n_ctx = model.config.n_positions
    with pytest.raises(ContextLengthError, match=f"the prompt is {n_ctx:,} tokens; the context window is {n_ctx:,}"):
        generate(model, tokenizer, [1] * n_ctx, SAMPLED)
    with pytest.raises(ValueError, match="the prompt is empty"):
        generate(model, tokenizer, "", SAMPLED)
    result = generate(model, tokenizer, [1] * (n_ctx - 3), replace(SAMPLED, max_new_tokens=50, temperature=0))
    assert (result.generated_tokens, result.stop_reason) == (3, "context_full")



def ending_at_once(loaded):
    """A copy of the tiny model whose next token is always most likely the end of text: the final
    LayerNorm gives every position the same output, the end-of-text token's (lengthened) embedding."""
    model, tokenizer = loaded
    model = copy.deepcopy(model)
    with torch.no_grad():
        wte, ln_f = model.transformer.wte.weight, model.transformer.ln_f
        wte[tokenizer.eos_id] *= 100
        ln_f.weight.zero_()
        ln_f.bias.copy_(wte[tokenizer.eos_id])
    return model, tokenizer


def test_min_new_tokens_holds_back_the_end_of_text(loaded):
    model, tokenizer = ending_at_once(loaded)
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    assert (generate(model, tokenizer, "Hello", greedy).generated_tokens,) == (0,)
    scheduler = Scheduler(model)
    try:
        for decoder in (model, scheduler):
            for params in (replace(greedy, min_new_tokens=3), replace(SAMPLED, min_new_tokens=3, seed=1)):
                result = generate(decoder, tokenizer, "Hello", params)
                assert (result.generated_tokens, result.stop_reason) == (3, "eos"), (decoder, params)
    finally:
        scheduler.close()
    # without the end of text's id there is nothing to hold back: said, not ignored
    with pytest.raises(ValueError, match="eos_id"):
        generate_module.Sampler(replace(greedy, min_new_tokens=3), 0, torch.device("cpu"))
    # Generate always writes something: a text the model would end at once goes on (Continue too).
    task = TASKS["generate"]
    done = next(e for e in run_task(task, model, tokenizer, GenerateInputs("The end."), replace(task.defaults, seed=0),
                                    False) if isinstance(e, TaskDone))
    assert done.result.generated_tokens >= 1
    # Tokens forced at the start (continuing from a chosen one) count toward min_new_tokens, as
    # they count toward max_new_tokens: after one, the end of text may come at once.
    forced = next(e for e in run_task(task, model, tokenizer, GenerateInputs("The end."), replace(task.defaults, seed=0),
                                      False, forced=[tokenizer.encode(" Then")[0]]) if isinstance(e, TaskDone))
    assert (forced.result.generated_tokens, forced.result.token_ids, forced.result.stop_reason) == (1, [], "eos")
    # Scoring a run's tokens (Compare's other side) holds the end back as its sampling did: each
    # token's score is the log-probability the run drew it with.
    params = replace(SAMPLED, min_new_tokens=3, seed=1, logprobs=1)
    result = generate(model, tokenizer, "Hello", params)
    prompt = tokenizer.encode("Hello")
    scores = generate_module.score_tokens(model, prompt, result.token_ids, params, eos_id=tokenizer.eos_id)
    assert scores == pytest.approx([entry["logprob"] for entry in result.logprobs], abs=1e-4)
    unheld = generate_module.score_tokens(model, prompt, result.token_ids, replace(params, min_new_tokens=0))
    assert unheld[0] < scores[0] - 1

"""The presence and frequency penalties (engine/generate.py, GeneratedTokenPenalty): OpenAI's
arithmetic, checked against a plain computation; only the tokens a request generated count, not
its prompt (prefilled whole or a chunk at a time), but the tokens a continued run drew before do;
off at 0, bit for bit; and in the scheduler, penalised rows (which pick alone) beside plain ones
each get the text they get alone, on PyTorch's path and on the decode kernels."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from engine import generate as generate_module, kernels
from engine.generate import GeneratedTokenPenalty, Sampler, SamplingParams, decode_tokens, generate
from engine.scheduler import Scheduler
from model import load_pretrained
from tasks import TASKS, GenerateInputs, TaskDone, run_task

from .conftest import serving

PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat"
PENALISED = SamplingParams(temperature=0, presence_penalty=0.6, frequency_penalty=1.5, max_new_tokens=24)


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint):
    return load_pretrained(tiny_checkpoint)


@pytest.fixture(params=["pytorch", pytest.param("kernels", marks=pytest.mark.slow)])
def on_each_path(request, adapter_checkpoint):
    """A model as the app serves it, decoding on PyTorch's products or on the decode kernels
    (built before the slow tier runs)."""
    model, tokenizer = serving(load_pretrained(adapter_checkpoint))
    if request.param == "pytorch":
        with kernels.switched_off():
            yield model, tokenizer
        return
    if kernels.decode_kernels() is None:
        pytest.skip(f"the decode kernels are not built here ({kernels.decode_path()})")
    yield model, tokenizer


def test_a_repeated_tokens_score_drops_by_its_count_times_the_frequency_penalty_plus_the_presence_penalty():
    prompt, generated = [5, 5, 7], [3, 3, 3, 9]
    scores = torch.randn(1, 16, generator=torch.Generator().manual_seed(0))
    penalised = GeneratedTokenPenalty(0.5, 0.7, len(prompt))(torch.tensor([prompt + generated]), scores.clone())
    expected = scores.double().clone()
    for token, count in Counter(generated).items():
        expected[0, token] -= count * 0.7 + 0.5
    assert torch.allclose(penalised.double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(penalised[0, [5, 7]], scores[0, [5, 7]])  # the prompt's own tokens: untouched
    favoured = GeneratedTokenPenalty(-1.0, 0.0, len(prompt))(torch.tensor([prompt + generated]), scores.clone())
    assert torch.allclose(favoured[0, [3, 9]], scores[0, [3, 9]] + 1.0)  # negative: repeats favoured


def test_penalties_of_zero_are_the_run_without_them_bit_for_bit(loaded):
    model, tokenizer = loaded
    plain = SamplingParams(temperature=0.9, top_k=40, max_new_tokens=20, seed=3, logprobs=5)
    zero = replace(plain, presence_penalty=0.0, frequency_penalty=-0.0)
    assert not zero.reads_history and not any(isinstance(p, GeneratedTokenPenalty) for p in zero.logits_processors())
    cpu = torch.device("cpu")
    assert Sampler(zero, 0, cpu).key == Sampler(plain, 0, cpu).key  # still picks with the crowd
    without, with_zero = (generate(model, tokenizer, PROMPT, params) for params in (plain, zero))
    assert with_zero.token_ids == without.token_ids and with_zero.logprobs == without.logprobs
    scores = torch.randn(1, 16)
    assert torch.equal(GeneratedTokenPenalty(0.0, 0.0, 0)(torch.tensor([[1, 1, 2]]), scores.clone()), scores)


def plainly_decoded(model, prompt: list[int], params: SamplingParams, drawn_before: int = 0) -> list[int]:
    """Greedy decoding the long way: the whole sequence through the model at each step, and the
    penalties subtracted by hand from the generated tokens' counts (and those of the prompt's last
    `drawn_before`, which an earlier run drew)."""
    ids, generated = list(prompt), list(prompt[len(prompt) - drawn_before:])
    for _ in range(params.max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0, -1].double()
        for token, count in Counter(generated).items():
            logits[token] -= params.frequency_penalty * count + params.presence_penalty
        token = int(logits.argmax())
        ids.append(token)
        generated.append(token)
    return ids[len(prompt):]


def test_the_penalties_count_the_generated_tokens_and_not_the_prompt(loaded):
    model, tokenizer = loaded
    prompt = tokenizer.encode(PROMPT)
    decoded = [int(t[0]) for t in decode_tokens(model, [prompt], PENALISED, [0])]
    assert decoded == plainly_decoded(model, prompt, PENALISED)
    free = [int(t[0]) for t in decode_tokens(model, [prompt], replace(PENALISED, presence_penalty=0.0,
                                                                         frequency_penalty=0.0), [0])]
    assert decoded != free and decoded[0] == free[0]  # nothing generated yet: the first token is the same
    assert max(Counter(decoded).values()) < max(Counter(free).values())  # the point of it: fewer repeats
    assert plainly_decoded(model, prompt, PENALISED, drawn_before=len(prompt)) != decoded  # had it counted the prompt


def test_a_prompt_prefilled_a_chunk_at_a_time_is_not_counted_either(loaded, monkeypatch):
    model, tokenizer = loaded
    prompt = tokenizer.encode(PROMPT)
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 4)  # the prompt goes in in several chunks
    assert len(prompt) > 3 * generate_module.PREFILL_CHUNK
    expected = plainly_decoded(model, prompt, PENALISED)
    assert [int(t[0]) for t in decode_tokens(model, [prompt], PENALISED, [0])] == expected
    scheduler = Scheduler(model)
    try:
        assert [int(t[0]) for t in scheduler.decode(prompt, PENALISED, 0)] == expected
    finally:
        scheduler.close()


@pytest.mark.parametrize("through", ["model", "scheduler"])
def test_a_run_continued_from_its_own_tokens_counts_them_as_generated(loaded, through):
    """A run continued from a token chosen in the page (run_task's `forced` tokens) goes on as that
    run would have: the tokens it drew before the choice count, though they now come in with the
    prompt; alone and through the scheduler, as the app runs it."""
    model, tokenizer = loaded
    decoder = model if through == "model" else Scheduler(model)
    task, inputs = TASKS["generate"], GenerateInputs(PROMPT)
    params = replace(PENALISED, min_new_tokens=0)

    def done(forced=()) -> TaskDone:
        return next(event for event in run_task(task, decoder, tokenizer, inputs, params, forced=forced)
                    if isinstance(event, TaskDone))

    whole = done().result.token_ids
    assert len(whole) == params.max_new_tokens
    continued = done(forced=whole[:10]).result.token_ids
    assert continued == whole[10:]
    prompt = tokenizer.encode(PROMPT) + whole[:10]  # the same tokens as a prompt: not counted
    as_prompt = [int(t[0]) for t in decode_tokens(model, [prompt], replace(params, max_new_tokens=14), [0])]
    assert as_prompt != continued


# Requests that differ in their penalties, beside plain ones, greedy and sampled.
MIXED = [
    ("The cat sat", PENALISED, None),
    ("The cat sat", replace(PENALISED, presence_penalty=0.0, frequency_penalty=0.0), None),
    ("Once upon a time", SamplingParams(temperature=0.9, top_k=40, frequency_penalty=1.0, seed=11,
                                        max_new_tokens=20), "summarize"),
    ("Once upon a time", SamplingParams(temperature=0.9, top_k=40, seed=11, max_new_tokens=20), "summarize"),
    ("Hello world", SamplingParams(temperature=1.0, presence_penalty=-1.5, seed=12, max_new_tokens=18), None),
    ("Hello world", SamplingParams(temperature=1.0, presence_penalty=2.0, repetition_penalty=1.2, seed=12,
                                   max_new_tokens=18), "translate"),
    ("The little bird", SamplingParams(temperature=1.0, seed=13, max_new_tokens=22), None),
]


def test_penalised_and_plain_rows_in_one_batch_each_get_their_text_alone(on_each_path):
    model, tokenizer = on_each_path
    scheduler = Scheduler(model, max_batch=8)
    try:
        streams = [scheduler.decode(tokenizer.encode(prompt), params, params.seed or 0, adapter=adapter)
                   for prompt, params, adapter in MIXED]
        together = [[int(t[0]) for t in tokens] for tokens in streams]
        assert scheduler.largest_batch == len(MIXED)
    finally:
        scheduler.close()
    for (prompt, params, adapter), tokens in zip(MIXED, together):
        alone = decode_tokens(model, [tokenizer.encode(prompt)], params, [params.seed or 0], adapter=adapter)
        assert tokens == [int(t[0]) for t in alone]
    assert together[0] != together[1] and together[2] != together[3]  # the penalties did change those rows

"""Sampling (engine/generate.py): each row draws from its processed distribution with its own
random numbers, alone or beside others, over the top-k candidates or the whole vocabulary."""
from __future__ import annotations

import pytest
import torch

from engine.generate import Sampler, SamplingParams, pick_tokens
from engine import generate as generate_module


def test_sampler_draws_from_the_processed_distribution():
    """Token frequencies follow softmax(logits / temperature), and a token top-k removed never comes."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler(SamplingParams(temperature=0.5, top_k=3), seed=0, device=torch.device("cpu"))
    draws = torch.cat([sampler(logits, torch.zeros(1, 1, dtype=torch.long)) for _ in range(20_000)])
    expected = torch.softmax(logits[0, :3] / 0.5, dim=0)
    observed = torch.bincount(draws, minlength=4) / len(draws)
    assert observed[3] == 0 and (observed[:3] - expected).abs().max() < 0.01


def test_rows_with_the_same_settings_sample_together_as_each_would_alone():
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.95)
    cpu = torch.device("cpu")
    crowd, alone = [Sampler(params, seed, cpu) for seed in range(4)], [Sampler(params, seed, cpu) for seed in range(4)]
    assert len({sampler.key for sampler in crowd}) == 1  # one group: processors and softmax run once for all rows
    history = torch.zeros(1, 3, dtype=torch.long)
    for step in range(30):
        logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(step))
        together = [int(token) for token in pick_tokens(crowd, logits, [history] * 4)]
        assert together == [int(alone[row](logits[row:row + 1], history)) for row in range(4)]


def softmax_widths(monkeypatch) -> list[int]:
    """The number of scores each later torch.softmax call normalises over."""
    widths, softmax = [], torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda scores, dim: widths.append(scores.shape[-1]) or softmax(scores, dim))
    return widths


def whole_vocabulary_token(params: SamplingParams, generator: torch.Generator, logits: torch.Tensor) -> int:
    """One row's token the way sampling went before it narrowed to the top-k candidates: every
    processor, the softmax and the cumulative sum over the whole vocabulary, then one draw."""
    scores = logits.float()
    for processor in params.logits_processors():
        scores = processor(None, scores)
    cumulative = scores.softmax(dim=-1).cumsum(dim=-1)  # not torch.softmax, which softmax_widths counts
    draw = torch.rand(1, generator=generator) * cumulative[:, -1]
    return int(torch.searchsorted(cumulative, draw[:, None], right=True).clamp(max=cumulative.shape[1] - 1))


@pytest.mark.parametrize("params, narrows", [
    (SamplingParams(temperature=0.8, top_k=40), True), (SamplingParams(top_k=3), True),
    (SamplingParams(temperature=1.3, top_k=50, top_p=0.9), False),  # top-p's sort breaks ties its own way
    (SamplingParams(top_k=200), False)])  # candidates too many to pay
def test_top_k_sampling_over_the_candidates_draws_what_the_whole_vocabulary_draws(params, narrows, monkeypatch):
    """With top-k on (and no top-p), sampling runs over each row's top_k + TIE_ROOM highest
    scores: each draw lands on the token it lands on over the whole vocabulary (in vocabulary
    order, as before)."""
    vocabulary = 8192
    widths = softmax_widths(monkeypatch)
    cpu = torch.device("cpu")
    samplers = [Sampler(params, seed, cpu) for seed in range(8)]
    generators = [torch.Generator().manual_seed(seed) for seed in range(8)]
    history = torch.zeros(1, 3, dtype=torch.long)
    for step in range(40):
        logits = 3 * torch.randn(8, vocabulary, generator=torch.Generator().manual_seed(step))
        picked = [int(token) for token in pick_tokens(samplers, logits, [history] * 8)]
        assert picked == [whole_vocabulary_token(params, generators[row], logits[row:row + 1]) for row in range(8)]
    assert set(widths) == {params.top_k + generate_module.TIE_ROOM if narrows else vocabulary}


def test_a_row_whose_ties_with_the_kth_score_overflow_the_candidates_samples_over_the_whole_vocabulary(monkeypatch):
    """Top-k keeps every score tied with the k-th. Row 0 has 30 such ties, more than the candidates
    hold: it samples over the whole vocabulary, and draws tied tokens the candidates would have
    missed; row 1, in the same group, samples over its candidates as it would alone."""
    params = SamplingParams(top_k=4)
    cpu = torch.device("cpu")
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0)) - 10
    logits[0, :3] = torch.tensor([2.0, 1.5, 1.2])
    ties = torch.arange(100, 400, 10)
    logits[0, ties] = 1.0  # the 4th highest score, 30 times
    assert len(ties) > params.top_k + generate_module.TIE_ROOM
    crowd = [Sampler(params, seed, cpu) for seed in range(2)]
    alone = [Sampler(params, seed, cpu) for seed in range(2)]
    generator = torch.Generator().manual_seed(0)
    drawn = set()
    widths = softmax_widths(monkeypatch)
    pick_tokens([Sampler(params, 0, cpu)] * 2, logits, [None, None])
    assert sorted(widths) == [params.top_k + generate_module.TIE_ROOM, logits.shape[1]]  # row 1 narrow, row 0 not
    for _ in range(300):
        together = [int(token) for token in pick_tokens(crowd, logits, [None, None])]
        assert together == [int(alone[row](logits[row:row + 1], None)) for row in range(2)]
        assert together[0] == whole_vocabulary_token(params, generator, logits[:1])
        drawn.add(together[0])
    assert len(drawn & set(ties.tolist())) > params.top_k + generate_module.TIE_ROOM




@pytest.mark.parametrize("params, kept", [
    (SamplingParams(temperature=1.0, min_p=0.4), [0, 1]),  # 0.15 and 0.05 are under 0.4 x 0.5
    (SamplingParams(temperature=1.0, typical_p=0.3), [1]),  # the token nearest the expected surprise, not the likeliest
], ids=["min-p", "typical-p"])
def test_min_p_and_typical_p_draw_only_what_transformers_keeps(params, kept):
    """The engine's min-p and typical-p are transformers' warpers: the tokens they drop are never
    drawn, and the ones they keep are drawn as often as their renormalised probability says."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    processors = params.logits_processors()
    assert [type(p).__name__ for p in processors] == ["MinPLogitsWarper" if params.min_p else "TypicalLogitsWarper"]
    expected = torch.softmax(processors[0](None, logits.clone()), dim=-1)[0]
    assert torch.nonzero(expected).flatten().tolist() == kept
    sampler = Sampler(params, seed=0, device=torch.device("cpu"))
    draws = torch.cat([sampler(logits, torch.zeros(1, 1, dtype=torch.long)) for _ in range(4_000)])
    observed = torch.bincount(draws, minlength=4) / len(draws)
    assert (observed - expected).abs().max() < 0.03  # about four standard deviations of 4,000 draws


def test_rows_that_differ_only_in_min_p_or_typical_p_each_pick_with_their_own():
    """Rows that pick together go through one row's processors: rows whose min-p or typical-p
    differ must not share them (they did, when the group was told by temperature, top-k and top-p
    alone, and a row with min-p off drew tokens min-p would have dropped for the row beside it)."""
    cpu = torch.device("cpu")
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(3, 1)
    settings = [SamplingParams(), SamplingParams(min_p=0.5), SamplingParams(typical_p=0.3)]
    crowd = [Sampler(params, 0, cpu) for params in settings]
    alone = [Sampler(params, 0, cpu) for params in settings]
    for _ in range(200):
        together = [int(token) for token in pick_tokens(crowd, logits, [None] * 3)]
        assert together == [int(alone[row](logits[row:row + 1], None)) for row in range(3)]

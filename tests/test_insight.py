"""What the app shows of why the model said what it said: token log-probabilities
(SamplingParams.logprobs), the adapter's strength (adapter_scale), adapter off and on compared
under one seed (ModelHost.run_compare, ui.tokens), and the logit lens (serve.inspection)."""
from __future__ import annotations

from dataclasses import replace

import re

import pytest
import torch

from engine.generate import SamplingParams, decode_tokens, generate
from engine.scheduler import Scheduler
from model import load_pretrained
from model.adapters import active_adapter
from serve.limits import checked_params
from serve.outcome import Outcome, status_line

from .conftest import refused, serving

PROMPT = [5, 17, 300, 42, 9]


@pytest.fixture(scope="module")
def loaded(adapter_checkpoint):
    return serving(load_pretrained(adapter_checkpoint))


def traced(model, params: SamplingParams, seed: int = 3, adapter=None) -> tuple[list[int], list]:
    trace: list = []
    tokens = [int(t[0]) for t in decode_tokens(model, [PROMPT], params, [seed], adapter=adapter, traces=[trace])]
    return tokens, trace


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_new_tokens=12, logprobs=5),
    SamplingParams(temperature=0.8, top_k=20, repetition_penalty=1.3, max_new_tokens=12, logprobs=10),
    SamplingParams(temperature=1.2, top_p=0.9, no_repeat_ngram_size=2, max_new_tokens=12, logprobs=20),
    SamplingParams(temperature=1.0, min_p=0.05, max_new_tokens=12, logprobs=10),
], ids=["greedy", "top-k", "top-p", "min-p"])
@torch.inference_mode()
def test_logprobs_are_the_processed_distribution_each_token_was_drawn_from(loaded, params):
    """Each token's log-probability and its alternatives equal a full recompute: the model's
    logits for the text so far, without a cache, through the same processors, log-softmaxed."""
    model, _ = loaded
    tokens, trace = traced(model, params)
    assert len(trace) >= len(tokens) and [t for t, _, _ in trace[:len(tokens)]] == tokens
    for step, (token, logprob, top) in enumerate(trace[:len(tokens)]):
        history = torch.tensor([PROMPT + tokens[:step]])
        scores = model(history)[:, -1].float()
        for processor in params.logits_processors():
            scores = processor(history, scores)
        expected = torch.log_softmax(scores, dim=-1)[0]
        assert abs(logprob - float(expected[token])) < 1e-5
        assert len(top) <= params.logprobs and all(abs(lp - float(expected[t])) < 1e-5 for t, lp in top)
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        if params.greedy:
            assert top[0][0] == token  # the top-1 at greedy is the chosen token
        assert any(t == token for t, _ in top) or logprob <= top[-1][1]


@torch.inference_mode()
def test_logprobs_change_nothing_of_the_text_and_cost_nothing_when_off(loaded):
    model, tokenizer = loaded
    params = SamplingParams(temperature=0.9, top_k=40, max_new_tokens=20, seed=5)
    off = generate(model, tokenizer, "Once upon a time", params)
    on = generate(model, tokenizer, "Once upon a time", replace(params, logprobs=3))
    assert off.logprobs == [] and (on.text, on.token_ids) == (off.text, off.token_ids)
    assert len(on.logprobs) == on.generated_tokens
    assert all(set(entry) == {"token", "bytes", "logprob", "id", "top"} and len(entry["top"]) <= 3
               for entry in on.logprobs)
    assert "".join(entry["token"] for entry in on.logprobs) == on.text or on.stop_reason == "stop_string"


def test_a_piece_of_a_character_is_listed_by_its_bytes(loaded):
    """Byte-level tokens split emoji and CJK characters: such a piece's text is U+FFFD, so that the
    texts still join into the output, and its bytes say which piece it is; the token view writes
    it as those bytes."""
    from engine.generate import token_logprobs
    from ui.tokens import listed, shown

    _, tokenizer = loaded
    ids = tokenizer.encode("我🐱")
    entries = token_logprobs(tokenizer, [(id, -0.5, [(id, -0.5)]) for id in ids])
    assert len(entries) > 2 and "\ufffd" in "".join(entry["token"] for entry in entries)
    assert b"".join(bytes(entry["bytes"]) for entry in entries).decode() == "我🐱"
    assert all(entry["top"][0]["bytes"] == entry["bytes"] for entry in entries)
    labels = [listed(entry) for entry in entries]
    assert all("\ufffd" not in label for label in labels) and labels[0].startswith("\\x")
    assert [shown(entry) for entry in entries] == labels


@torch.inference_mode()
def test_a_stop_strings_own_tokens_are_not_listed_as_written(loaded):
    model, tokenizer = loaded
    params = SamplingParams(temperature=1.0, max_new_tokens=20, logprobs=2, seed=3)
    free = generate(model, tokenizer, "Once upon a time", params)
    middle = len(free.logprobs) // 2
    assert middle >= 2, free
    stop = free.logprobs[middle]["token"] + free.logprobs[middle + 1]["token"]  # two whole tokens from the middle
    cut = generate(model, tokenizer, "Once upon a time", replace(params, stop=(stop,)))
    assert cut.stop_reason == "stop_string" and cut.text
    tokens = [entry["token"] for entry in cut.logprobs]
    assert "".join(tokens).startswith(cut.text) and len("".join(tokens[:-1])) < len(cut.text)  # each one needed
    assert len(cut.logprobs) < cut.generated_tokens and cut.token_ids == [entry["id"] for entry in cut.logprobs]
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)]


@pytest.mark.slow  # the decode kernels, whose rows do not depend on their batch (built first)
@torch.inference_mode()
def test_the_scheduler_reports_the_same_logprobs_as_a_request_alone(loaded):
    model, tokenizer = loaded
    params = SamplingParams(temperature=0.8, top_k=20, max_new_tokens=10, logprobs=4, seed=7)
    _, alone = traced(model, params, seed=7)
    scheduler = Scheduler(model)
    beside = scheduler.decode(tokenizer.encode("Another request"), replace(params, logprobs=0), 1)
    trace: list = []
    tokens = [int(t[0]) for t in scheduler.decode(PROMPT, params, 7, trace=trace)]
    list(beside)
    assert trace[:len(tokens)] == alone[:len(tokens)]


@torch.no_grad()
def test_adapter_scale_zero_is_the_base_model_and_one_the_adapter_as_trained(loaded):
    model, _ = loaded
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    base = model(ids)
    with active_adapter("summarize"):
        trained = model(ids)
    with active_adapter("summarize", 0.0):
        assert torch.equal(model(ids), base)
    with active_adapter("summarize", 1.0):
        assert torch.equal(model(ids), trained)
    with active_adapter("summarize", 0.5):
        half = model(ids)
    with active_adapter("summarize", 2.0):
        double = model(ids)
    assert not torch.allclose(half, base) and not torch.allclose(half, trained)
    # LoRA adds a scaled update to each projection's output, so halfway lies between, roughly
    assert (half - base).norm() < (trained - base).norm() < (double - base).norm()
    step = ids[:, :1]  # per row, in one decode-sized call, as the scheduler's steps mix requests
    with active_adapter("summarize"):
        trained_step = model(step)
    with active_adapter([("summarize", 0.0), ("summarize", 1.0)]):
        rows = model(step)
    assert torch.equal(rows[0], model(step)[0]) and torch.equal(rows[1], trained_step[1])


@torch.inference_mode()
def test_adapter_scale_reaches_decoding(loaded):
    model, _ = loaded
    params = SamplingParams(temperature=0, max_new_tokens=10)
    base, _ = traced(model, replace(params, logprobs=1))
    zero, _ = traced(model, replace(params, adapter_scale=0.0, logprobs=1), adapter="summarize")
    assert zero == base
    with refused("out_of_range", name="adapter_scale", low=0.0, high=2.0, value="2.5"):
        checked_params(SamplingParams(), adapter_scale=2.5)


def compare_values(api, **settings) -> dict:
    bound = api.signature.bind(**settings)
    bound.apply_defaults()
    return bound.arguments


@pytest.fixture(scope="module")
def host(adapter_checkpoint):
    from serve.model_host import ModelHost
    return ModelHost([str(adapter_checkpoint)], device="cpu")


def compared(host, **settings):
    from ui.tabs.summarise import SUMMARIZE

    updates = list(host.run_compare(SUMMARIZE.api, {**compare_values(SUMMARIZE.api, **settings), "compare": "adapter"}))
    return updates[-1]


@pytest.mark.slow  # the decode kernels, whose rows do not depend on their batch (built first)
def test_compare_with_the_adapter_at_zero_gives_the_same_text_twice(host):
    from serve.outcome import english_status

    """Adapter off against adapter on at strength 0 (the base model exactly), one seed: the two
    sides draw the same random numbers, so the texts are the same, and nothing is marked."""
    texts, outcome, comparison = compared(host, article="The sun rose. A bird sang.", temperature=1.0, top_k=40,
                                          seed=4, max_new_tokens=16, adapter_scale=0.0)
    status = english_status(outcome)
    assert texts[0] == texts[1] and texts[0]
    assert comparison.same and status.startswith("seed 4 · ")
    assert status.endswith(" · adapter off vs adapter on at strength 0: the output and counts are with adapter off")
    assert comparison.entries[0] == comparison.entries[1]
    # each side's tokens under the other: the same model, so the same log-probabilities
    assert comparison.under_other[0] == pytest.approx([e["logprob"] for e in comparison.entries[0]], abs=1e-5)


def test_a_comparison_says_the_off_sides_own_notes_as_its_own(host):
    """French -> German goes through English on each side, each its own way (the off side with
    example pairs): the line gives the shown side's English (adapter on), and the other side's,
    marked as such."""
    from serve.outcome import english_status
    from ui.tabs.translate import TRANSLATE

    values = compare_values(TRANSLATE.api, text="Le chat dort.", source="French", target="German", max_new_tokens=8,
                            adapter=True)
    values["compare"] = "adapter"
    *_, (texts, outcome, comparison) = host.run_compare(TRANSLATE.api, values)
    status = english_status(outcome)
    steps = [prompt.split("\n\n")[0] for prompt in comparison.prompts]
    assert steps[0] != steps[1] and " = " in steps[0]  # the off side's first step sends pairs
    parts = status.split(" · ")
    on = [part for part in parts if part.startswith("translated through English")]
    off = [part for part in parts if part.startswith("adapter off: translated through English")]
    assert len(on) == len(off) == 1
    prompt_tokens = [int(re.search(r"first step: (\d+) prompt", part)[1]) for part in (off[0], on[0])]
    assert prompt_tokens[0] > prompt_tokens[1]
    assert "the output and counts are with adapter on" in status and f" + {len(comparison.entries[1])} generated" in status

    # With the adapter switched off, the line is the off side's, and the on side's note is marked.
    *_, (_, outcome, comparison) = host.run_compare(TRANSLATE.api, {**values, "adapter": False})
    parts = english_status(outcome).split(" · ")
    assert "adapter off vs adapter on: the output and counts are with adapter off" in parts
    assert f"{prompt_tokens[0]} prompt" in next(part for part in parts if part.startswith("translated through"))
    assert len([part for part in parts if part.startswith("adapter on: translated through English")]) == 1


def test_compare_marks_the_first_token_where_adapter_off_and_on_part(host):
    from serve.comparing import first_difference
    from ui.tokens import Insight

    texts, _, comparison = compared(host, article="The sun rose. A bird sang.", temperature=0, max_new_tokens=16,
                                    seed=4)
    ids = [[e["id"] for e in side] for side in comparison.entries]
    at = comparison.diverges_at[0]
    assert at is not None and at == first_difference(*ids)
    assert ids[0][:at] == ids[1][:at] and (at == min(map(len, ids)) or ids[0][at] != ids[1][at])
    assert texts[0] != texts[1]
    view = Insight.compared(comparison, "en", texts)
    for row in view["rows"]:
        marked = [token["i"] for token in row["tokens"] if token["mark"] == "diverges"]
        assert marked == ([at] if at < len(row["tokens"]) else [])
    assert view["note"] == f"the two differ from token {at + 1}"
    # Outputs the task's tidying made the same (a trailing newline, say) say so.
    tidied = Insight.compared(comparison, "en", ("A bird sang.", "A bird sang."))["note"]
    assert tidied == f"the texts are the same, but their tokens differ from token {at + 1}"
    assert Insight.compared(comparison, "zh", ("A", "A"))["note"] == f"两段文字相同，但词元从第 {at + 1} 个起不同"
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and first_difference([1, 2], [1, 2, 3]) == 2


@torch.no_grad()
def test_the_logit_lens_last_layer_is_the_models_own_prediction(loaded):
    """ln_f and the tied head after the last block are the model's own logits; each row is a
    layer, each column a position; with an adapter on, `changed` marks where the top-1 moved."""
    from serve.inspection import lens_logits, logit_lens

    model, tokenizer = loaded
    prompt = "The little bird sang a song"
    ids = torch.tensor([tokenizer.encode(prompt)])
    logits = lens_logits(model, ids)
    assert logits.shape == (model.config.n_layer, ids.shape[1], model.config.vocab_size)
    assert torch.equal(logits[-1], model(ids)[0].float())
    lens = logit_lens(model, tokenizer, prompt)
    own = model(ids)[0].float().softmax(-1).max(-1)
    assert torch.equal(lens.probabilities[-1], own.values) and lens.changed is None
    assert [len(row) for row in lens.top_tokens] == [ids.shape[1]] * model.config.n_layer
    with_adapter = logit_lens(model, tokenizer, prompt, adapter="summarize")
    with active_adapter("summarize"):
        adapted = model(ids)[0].float().softmax(-1).max(-1)
    assert torch.equal(with_adapter.probabilities[-1], adapted.values)
    assert torch.equal(with_adapter.changed[-1], adapted.indices != own.indices)


def test_continuing_from_a_chosen_token_keeps_the_runs_length_and_counts(loaded):
    """Continuing from token 4 with an alternative in its place: the output is as long as the run
    it continues (the kept tokens count in max_new_tokens), and the counts are that run's: its
    prompt, and every token of the output as generated."""
    from tasks import TASKS, GenerateInputs, TaskDone, run_task
    model, tokenizer = loaded
    task = TASKS["generate"]
    params = replace(task.defaults, seed=2, max_new_tokens=10, temperature=0.7)

    def done(forced=()):
        return next(e for e in run_task(task, model, tokenizer, GenerateInputs("Once upon a time"), params,
                                        forced=forced) if isinstance(e, TaskDone))
    first = done()
    assert first.result.generated_tokens == 10
    forced = [*first.result.token_ids[:3], (first.result.token_ids[3] + 1) % model.config.vocab_size]
    again = done(forced)
    assert again.result.prompt_tokens == first.result.prompt_tokens
    assert again.result.generated_tokens == 10 and len(again.result.token_ids) == 10 - len(forced)
    # From the last token: the output is the run's, that token replaced, and nothing more is drawn.
    last = [*first.result.token_ids[:9], (first.result.token_ids[9] + 1) % model.config.vocab_size]
    at_end = done(last)
    assert (at_end.result.generated_tokens, at_end.result.token_ids, at_end.result.stop_reason) == (10, [], "max_tokens")
    assert at_end.text == task.postprocess(tokenizer.decode(last))
    line = status_line(Outcome.done(at_end.result, None, [], []), "en")  # no token drawn: no speed
    assert " · — tokens/s · " in line and "0.0" not in line


def test_swap_turns_a_run_round_but_not_an_edit():
    from ui.last_run import LastRun
    from ui.tabs.translate import turned_boxes

    last_run = LastRun(values={"text": "Le chat dort.", "source": "French", "target": "English"},
                       output="The cat sleeps.")
    assert turned_boxes("French", "English", "Le chat dort.", "The cat sleeps.", last_run) == \
        ("The cat sleeps.", "Le chat dort.")
    # and back again, from the boxes as the first swap left them
    assert turned_boxes("English", "French", "The cat sleeps.", "Le chat dort.", last_run) == \
        ("Le chat dort.", "The cat sleeps.")
    for text, translation in (("Le chien dort.", "The cat sleeps."), ("Le chat dort.", "")):  # edited; none yet
        assert turned_boxes("French", "English", text, translation, last_run) is None


def test_the_users_example_pairs_turn_round_with_the_direction_only():
    from ui.tabs.translate import choose_pair

    own = "dog = chien\nthe cat=le chat\nnot a pair"
    examples = choose_pair("source", "French", "English", ("English", "French"), own)["examples"]
    assert examples == "chien = dog\nle chat = the cat\nnot a pair"
    examples = choose_pair("target", "English", "English", ("English", "French"), own)["examples"]  # a swap
    assert examples == "chien = dog\nle chat = the cat\nnot a pair"
    examples = choose_pair("target", "English", "German", ("English", "French"), own)["examples"]  # another: kept
    assert isinstance(examples, dict) and "value" not in examples


def test_picking_the_other_sides_language_swaps_the_two():
    from ui.tabs.translate import choose_pair

    picked = choose_pair("target", "English", "English", ("English", "French"), "")
    assert picked["source"] == "French" and picked["last"] == ("French", "English")
    assert picked["target"] == {"__type__": "update"}  # already English: left as it is
    another = choose_pair("target", "English", "German", ("English", "French"), "")  # not a swap
    assert another["last"] == ("English", "German") and another["source"] == {"__type__": "update"}

"""One comparison for every difference (serve/comparing.py): the request names what differs
("adapter", "steering", "model:<id>", "setting:<name>=<value>") and the host runs both sides at
once under one seed through the path it runs every request on. Where nothing really differs the
sides are the same bit for bit; models of different tokenizers part by text."""
from __future__ import annotations

import threading

import pytest

from serve.apis import APIS
from serve.comparing import (COMPARED_SETTINGS, MODEL, SETTING, Axis, Comparison, first_difference,
                             first_difference_by_text, parse_compare, token_at)
from serve.messages import english
from serve.outcome import english_status

from .conftest import make_hf_checkpoint, refused

GENERATE = APIS["generate"]
STORY = {"prompt": "Once upon a time", "max_new_tokens": 12, "temperature": 1.0, "seed": 11}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """One small checkpoint saved twice (the same weights under two names), and one of another
    tokenizer: the bundled model's SentencePiece."""
    root = tmp_path_factory.mktemp("twins")
    shape = dict(n_positions=128, n_embd=64, n_layer=2, n_head=2)
    return [str(make_hf_checkpoint(root / name, seed=3, **shape)) for name in ("first", "second")]


@pytest.fixture(scope="module")
def host(twins):
    from serve.model_host import ModelHost
    return ModelHost([*twins, "bundled"], device="cpu")


def last(updates):
    *_, final = updates
    return final


def compared(host, compare: str, **values):
    return last(host.run_compare(GENERATE, {**STORY, **values, "compare": compare}))


def test_compare_names_one_axis_and_refuses_the_rest_naming_the_field():
    models = ("bundled", "gpt2")
    assert parse_compare("adapter", models) == Axis("adapter")
    assert parse_compare(" steering ", models) == Axis("steering")
    assert parse_compare("model:gpt2", models) == Axis(MODEL, "gpt2")
    assert parse_compare("setting:temperature=0.7", models) == Axis(SETTING, "temperature", 0.7)
    assert parse_compare("setting: top_k = 40", models) == Axis(SETTING, "top_k", 40)
    assert parse_compare("setting:top_k=40", models).spelled == "setting:top_k=40"
    assert set(COMPARED_SETTINGS) >= {"temperature", "top_k", "top_p", "min_p", "max_new_tokens"}
    with refused("compare_model", name="compare", model="gpt2-xl") as caught:
        parse_compare("model:gpt2-xl", models)
    assert english(caught.value.message) == ("compare names the model gpt2-xl, which is not one of the models here "
                                             "(bundled, gpt2)")
    with refused("compare_setting", name="compare", setting="warmth"):
        parse_compare("setting:warmth=2", models)
    with refused("compare_value", name="compare") as caught:
        parse_compare("setting:top_k=1001", models)
    assert english(caught.value.message) == "compare: top_k must be between 0 and 1,000, got 1001"
    with refused("compare_value") as caught:
        parse_compare("setting:top_k=4.5", models)
    assert caught.value.message.field("error").key == "not_integer"
    with refused("compare_value") as caught:
        parse_compare("setting:temperature=0.001", models)
    assert caught.value.message.field("error").key == "temperature_low"
    with refused("compare_value") as caught:
        parse_compare("setting:max_new_tokens=600", models)  # the app's cap, not the engine's
    with refused("compare_value") as caught:
        parse_compare("setting:top_p=warm", models)
    assert caught.value.message.field("error").key == "not_number"
    for bad in ("", "adapters", "model:", "setting:top_k", "adapter:on", None, 3):
        with refused("one_of", name="compare"):
            parse_compare(bad, models)


def test_two_identical_models_give_identical_sides_bit_for_bit(host, twins):
    """The same weights under two names: two models, two schedulers, the same seed: the same tokens,
    log-probabilities and alternatives, and no difference to mark."""
    texts, outcome, comparison = compared(host, f"model:{twins[1]}")
    assert outcome.ran, english_status(outcome)
    assert texts[0] == texts[1] and texts[0]
    assert comparison.entries[0] == comparison.entries[1]  # every float the same
    assert comparison.diverges_at == (None, None) and comparison.same and not comparison.by_text
    assert comparison.under_other[0] == comparison.under_other[1]
    assert [english(label) for label in comparison.labels] == [f"model {twins[0]}", f"model {twins[1]}"]
    assert comparison.asked == ({"model": twins[0]}, {"model": twins[1]})
    status = english_status(outcome)
    assert status.startswith("seed 11 · ") and f"model {twins[0]} vs model {twins[1]}: the output and counts are " \
                                                f"with model {twins[0]}" in status
    assert all(side.ran and side.tokens_per_second for side in comparison.outcomes)  # each side's speed
    assert host.current.name == twins[0]  # the other is held beside it, not served


@pytest.mark.slow  # the decode kernels, whose rows do not depend on their batch (built first)
def test_the_same_model_twice_and_a_no_op_setting_give_identical_sides(host, twins):
    """Both sides on one model share its batch, which the decode kernels compute row by row, each
    row as it would be alone; PyTorch's products may add up a batch of two otherwise than one."""
    same_model = compared(host, f"model:{twins[0]}")[2]
    assert same_model.entries[0] == same_model.entries[1] and same_model.same
    _, outcome, no_op = compared(host, "setting:top_k=0", top_k=0)
    assert no_op.entries[0] == no_op.entries[1] and no_op.same
    assert [english(label) for label in no_op.labels] == ["top_k 0", "top_k 0"]
    assert "top_k 0 vs top_k 0: the output and counts are with top_k 0" in english_status(outcome)


def test_a_setting_comparison_is_the_request_with_one_setting_changed(host):
    """temperature 0.7 against 1.0: each side is that request run alone, under the same seed."""
    texts, outcome, comparison = compared(host, "setting:temperature=1.0", temperature=0.7)
    alone = [last(host.run(GENERATE, {**GENERATE.request(STORY), "temperature": t}))[0] for t in (0.7, 1.0)]
    assert texts == alone and texts[0] != texts[1]
    assert [english(label) for label in comparison.labels] == ["temperature 0.7", "temperature 1"]
    assert comparison.asked == ({}, {"temperature": 1.0}) and comparison.shown == 0
    at = comparison.diverges_at[0]
    assert at == first_difference(*([e["id"] for e in side] for side in comparison.entries))
    assert comparison.diverges_at == (at, at)
    # each side's tokens under the other side's settings: the same model, another temperature
    assert comparison.under_other[0][:at] != [e["logprob"] for e in comparison.entries[0]][:at]
    assert "changed settings: temperature 0.7" in english_status(outcome)
    assert "changed settings: temperature" not in english_status(comparison.outcomes[1])  # 1.0 is the default


def test_models_of_different_tokenizers_part_by_text(host, twins):
    """The bundled model (SentencePiece) against a byte-level BPE: no token ids in common, so the
    first difference is the first character where the texts part, and the token of each side that
    holds it; neither side's tokens can be scored by the other."""
    texts, outcome, comparison = compared(host, "model:bundled", temperature=0)
    assert outcome.ran and comparison.by_text and comparison.under_other == (None, None)
    character = comparison.character
    joined = [b"".join(bytes(e["bytes"]) for e in side).decode(errors="replace") for side in comparison.entries]
    assert character is not None and joined[0][:character] == joined[1][:character]
    assert joined[0][character:character + 1] != joined[1][character:character + 1]
    for side, at in zip(comparison.entries, comparison.diverges_at):
        before = b"".join(bytes(e["bytes"]) for e in side[:at]).decode(errors="replace")
        assert len(before) <= character and (at == len(side) or len(before + side[at]["token"]) > character)
    assert [english(label) for label in comparison.labels] == [f"model {twins[0]}", "model bundled"]


def test_the_first_difference_by_text_maps_a_character_to_each_sides_token():
    def entries(*tokens: str) -> list[dict]:
        return [{"bytes": list(token.encode()), "token": token} for token in tokens]
    a, b = entries("The", " cat", " sat"), entries("The c", "a", "t ran")
    assert first_difference_by_text(a, b) == (8, (2, 2))  # " sat" and "t ran" part at "s"/"r"
    assert first_difference_by_text(a, entries("The cat sat")) == (None, (None, None))
    assert first_difference_by_text(entries("ab"), entries("a", "b", "c")) == (2, (1, 2))  # one ends first
    # a character of two bytes, whose second byte differs: its first token is where they part
    assert first_difference_by_text(entries("x", "é"), entries("x", "è")) == (1, (1, 1))
    assert token_at(entries("ab", "cd"), 3) == 1 and token_at(entries("ab"), 2) == 1


def test_a_model_comparison_streams_beside_other_runs_and_refuses_what_does_not_fit(host, twins, monkeypatch):
    """Both sides decode at once, each in its own model's batch, while another request on the
    served model goes on; a second model whose weights would not fit the memory free is refused,
    naming it, and the model served stays."""
    from serve import model_host

    updates = host.run_compare(GENERATE, {**STORY, "max_new_tokens": 60, "compare": f"model:{twins[1]}"})
    first = next(updates)
    assert first[2] is None and not first[1]  # streaming
    beside = threading.Thread(target=lambda: last(host.run(GENERATE, GENERATE.request({**STORY, "seed": 1}))))
    beside.start()
    beside.join(60)
    assert not beside.is_alive()
    assert last(updates)[1].ran
    served = host.current
    monkeypatch.setattr(model_host, "BYTES_PER_PARAMETER", 10**12)
    _, outcome, comparison = compared(host, "model:bundled")
    assert comparison is None and outcome.message.key == "not_enough_memory"
    assert outcome.message.field("name") == "bundled" and host.current is served


def test_the_request_names_what_it_leaves_out_or_does_not_take(host):
    _, outcome, _ = last(host.run_compare(GENERATE, {"prompt": "Hi", "compare": "adapter", "warmth": 3}))
    assert outcome.message.key == "unknown_parameter" and outcome.message.field("name") == "'warmth'"
    _, outcome, _ = last(host.run_compare(GENERATE, {"compare": "setting:top_k=3"}))
    assert english(outcome.message) == "prompt is missing: /generate needs it"
    _, outcome, _ = last(host.run_compare(GENERATE, "Hi"))
    assert outcome.message.key == "values_object"
    _, outcome, _ = compared(host, "steering")
    assert outcome.message.key == "compare_no_steering"
    _, outcome, _ = compared(host, "model:nowhere")
    assert outcome.message.key == "compare_model" and outcome.message.field("name") == "compare"
    _, outcome, _ = compared(host, "adapter")  # Generate has no adapter
    assert outcome.message.key == "no_task_adapter"


def test_a_comparison_travels_as_json_and_back(host, twins):
    comparison = compared(host, "setting:top_k=5")[2]
    again = Comparison.from_json(comparison.as_json())
    assert again == comparison

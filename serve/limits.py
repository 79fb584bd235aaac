"""What the app takes: each decoding setting's range and the checks that refuse the rest.

The engine decodes whatever SamplingParams it is given; what a user may ask for is this app's
choice, made here, where the page, the Gradio API and `/v1` all check their values (the sliders
are built from LIMITS too). A refusal names the setting, its range and what it got.
"""
from __future__ import annotations

from dataclasses import replace

from engine.generate import MAX_SEED, SamplingParams
from tasks.messages import Refusal

# (lowest, highest) accepted value of each numeric setting; the UI builds its sliders from these.
LIMITS = {
    "temperature": (0.0, 5.0),
    "top_k": (0, 1000),
    "top_p": (0.01, 1.0),
    "min_p": (0.0, 1.0),
    "typical_p": (0.01, 1.0),
    "repetition_penalty": (0.5, 3.0),
    "presence_penalty": (-2.0, 2.0),  # OpenAI's range for both
    "frequency_penalty": (-2.0, 2.0),
    "no_repeat_ngram_size": (0, 10),
    "max_new_tokens": (1, 2048),
    "min_new_tokens": (0, 2048),
    "seed": (0, MAX_SEED),
    "adapter_scale": (0.0, 2.0),
    "logprobs": (0, 20),
    # alpha of steering (serve/running.py); negative steers away from the positive texts. A vector
    # is about as long as the residual it is added to, and on the bundled model strength 2 of one
    # word pair already turns text into repeats (DESIGN.md, "Interventions").
    "steer_strength": (-10.0, 10.0),
}
INTEGER_SETTINGS = ("top_k", "no_repeat_ngram_size", "max_new_tokens", "min_new_tokens", "seed", "logprobs")
# Stop strings a run may have, the task's own included, and their length: each is looked for in
# the text after every token.
MAX_STOP_STRINGS, MAX_STOP_LENGTH = 8, 100
# Between 0 (greedy) and this, sampling is greedy in all but name, and far below it the scores
# divided by the temperature overflow to infinity, which no sampler can draw from.
MIN_TEMPERATURE = 0.01


def brief(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters: an error message quotes what it refuses, however big."""
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # str() of a huge int is slow, or refused
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_setting(name: str, value, low, high, integer: bool = False):
    """`value` if it is a number (an integer, if `integer`) from low to high; otherwise a Refusal
    that names the setting, its range and what it got. NaN, the infinities, booleans and integers
    too large for a float are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refusal("not_integer" if integer else "not_number", name=name, value=brief(value))
    if not low <= value <= high:
        raise Refusal("out_of_range", name=name, low=low, high=high, value=brief(value))
    if integer and value != int(value):
        raise Refusal("not_integer", name=name, value=repr(value))
    return int(value) if integer else float(value)  # float: transformers' processors refuse an int temperature


def check_temperature(value: float) -> float:
    if 0 < value < MIN_TEMPERATURE:
        raise Refusal("temperature_low", low=MIN_TEMPERATURE, value=value)
    return value


def added_stops(asked: tuple[str, ...], own: tuple[str, ...]) -> tuple[str, ...]:
    """The stop strings a request asks for besides the task's `own` (which always apply), checked:
    with those, at most MAX_STOP_STRINGS, none empty or longer than MAX_STOP_LENGTH characters. A
    Refusal (its field named "stop") says how many the request may add."""
    own = tuple(dict.fromkeys(own))
    fits = all(isinstance(stop, str) and 0 < len(stop) <= MAX_STOP_LENGTH for stop in asked)
    added = tuple(stop for stop in dict.fromkeys(asked) if stop not in own) if fits else ()
    room = MAX_STOP_STRINGS - len(own)
    if not fits or len(added) > room:
        limits = dict(name="stop", count=room, length=MAX_STOP_LENGTH)
        raise Refusal("stop_strings_own", **limits, own=len(own)) if own else Refusal("stop_strings", **limits)
    return added


def checked_params(base: SamplingParams, **settings) -> SamplingParams:
    """`base` with `settings`, each checked against LIMITS (integers as int, the rest as float),
    or a Refusal naming the first one out of its range."""
    checked = {}
    for name, value in settings.items():
        if not (name == "seed" and value is None):
            low, high = LIMITS[name]
            checked[name] = check_setting(name, value, low, high, integer=name in INTEGER_SETTINGS)
    if "temperature" in checked:
        check_temperature(checked["temperature"])
    return replace(base, **checked)

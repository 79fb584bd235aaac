"""The app's limits on decoding settings (serve/limits.py): each bound refused with its name."""
from __future__ import annotations

import math

import pytest

from engine.generate import SamplingParams
from serve.limits import LIMITS, checked_params
from tasks.messages import Refusal

from .conftest import refused


BAD_VALUES = [(name, value) for name, (low, high) in LIMITS.items()
              for value in (low - 1 if isinstance(low, int) else low - 0.01, high + 1, math.nan, math.inf, True, "1")]


@pytest.mark.parametrize("name,value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_each_bound_is_rejected(name, value):
    with pytest.raises(Refusal) as refusal:
        checked_params(SamplingParams(), **{name: value})
    message = refusal.value.message
    assert message.field("name", "temperature") == name  # (temperature_low names none: it is temperature's own)


def test_integer_settings_reject_fractions_and_stop_strings_are_checked():
    with refused("not_integer", name="top_k", value="2.5"):
        checked_params(SamplingParams(), top_k=2.5)
    with refused("stop_strings", count=8, length=100):
        checked_params(SamplingParams(), stop=("",))
    with refused("stop_strings"):
        checked_params(SamplingParams(), stop=tuple("abcdefghij"))
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert checked_params(SamplingParams(), top_k=3.0, seed=None).top_k == 3

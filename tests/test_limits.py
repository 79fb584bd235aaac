"""The app's limits on decoding settings (serve/limits.py): each bound refused with its name."""
from __future__ import annotations

import math

import pytest

from engine.generate import SamplingParams
from serve.limits import LIMITS, checked_params


BAD_VALUES = [(name, value) for name, (low, high) in LIMITS.items()
              for value in (low - 1 if isinstance(low, int) else low - 0.01, high + 1, math.nan, math.inf, True, "1")]


@pytest.mark.parametrize("name,value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_each_bound_is_rejected(name, value):
    with pytest.raises(ValueError, match=name):
        checked_params(SamplingParams(), **{name: value})


def test_integer_settings_reject_fractions_and_stop_strings_are_checked():
    with pytest.raises(ValueError, match="top_k must be an integer"):
        checked_params(SamplingParams(), top_k=2.5)
    with pytest.raises(ValueError, match="stop must be"):
        checked_params(SamplingParams(), stop=("",))
    with pytest.raises(ValueError, match="stop must be"):
        checked_params(SamplingParams(), stop=tuple("abcdefghij"))
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert checked_params(SamplingParams(), top_k=3.0, seed=None).top_k == 3

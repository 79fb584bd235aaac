"""The app's limits on decoding settings (serve/limits.py): each bound refused with its name; the stop
strings a request adds to its task's own, and how a run's record names them (serve/running.py)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from engine.generate import Result, SamplingParams
from serve.limits import LIMITS, added_stops, checked_params
from serve.outcome import Outcome, status_line
from serve.running import (ADAPTER_OFF, asked_again, asked_stops, changed_settings, sampling_params, setting_params,
                           stop_lines)
from tasks import TASKS
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


def test_integer_settings_reject_fractions():
    with refused("not_integer", name="top_k", value="2.5"):
        checked_params(SamplingParams(), top_k=2.5)
    assert checked_params(SamplingParams(), top_k=3.0, seed=None).top_k == 3


def test_stop_strings_are_checked_with_the_tasks_own_counted():
    with refused("stop_strings", name="stop", count=8, length=100):
        added_stops(("",), ())
    with refused("stop_strings", name="stop", count=8):
        added_stops(tuple("abcdefghij"), ())
    with refused("stop_strings", name="stop", length=100):
        added_stops(("x" * 101,), ())
    with refused("stop_strings"):
        added_stops((3,), ())
    with refused("stop_strings_own", name="stop", count=6, own=2):
        added_stops(tuple("abcdefg"), ("\nUser:", "\nBot:"))
    # the task's own and repeats are not counted twice
    assert added_stops(("a", "\nBot:", "a", "b", "c", "d", "e", "f"), ("\nUser:", "\nBot:")) == tuple("abcdef")
    assert SamplingParams(stop="\n").stop == ("\n",)


def test_stop_strings_come_one_a_line_with_their_escapes_read_or_as_a_list_as_they_are():
    assert stop_lines("\\n\\nThe end\n\\tx\r\n\nback\\\\nslash\n  \nC:\\dir") == (
        "\n\nThe end", "\tx", "back\\nslash", "  ", "C:\\dir")
    assert asked_stops(["a\\n", "\n"]) == ("a\\n", "\n")  # a list's strings are taken as they are
    with refused("stop_kind", name="stop", kind="int"):
        asked_stops(3)


def api_values(task: str, **changed) -> dict:
    return {**{param.name: param.default for param in setting_params(TASKS[task])}, **changed}


def test_a_runs_stop_strings_and_penalties_are_said_and_asked_again_as_they_ran():
    """The stop strings a request adds come after the task's own (Chat's speaker tags); they and
    the penalties are among the settings the status line names, in a form the API takes back, and
    the run asked again from its record has the same params."""
    task = TASKS["dialogue"]
    values = api_values("dialogue", stop="The end\n\\n\\n\n\\nBot:", presence_penalty=0.5, frequency_penalty=-0.25)
    params = sampling_params(task, values)
    assert params.stop == ("\nUser:", "\nBot:", "The end", "\n\n")
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.25)
    changed = changed_settings(params, task.defaults)
    assert changed == [("presence_penalty", 0.5), ("frequency_penalty", -0.25), ("stop", ("The end", "\n\n"))]
    outcome = Outcome.done(Result("", 7, 5, 3, 10.0, "stop_string"), ADAPTER_OFF, changed, [])
    assert ('changed settings: presence_penalty 0.5, frequency_penalty -0.25, stop ["The end", "\\n\\n"]'
            in status_line(outcome, "en"))
    assert '存在惩罚 0.5，频率惩罚 -0.25，停止串 ["The end", "\\n\\n"]' in status_line(outcome, "zh")
    assert Outcome.from_json(json.loads(json.dumps(outcome.as_json()))) == outcome
    again = asked_again(outcome, task)
    assert sampling_params(task, {**values, **again}) == replace(params, seed=7)
    assert sampling_params(task, api_values("dialogue")).stop == task.defaults.stop  # none added: the task's own


def test_the_line_end_an_adapter_adds_counts_among_the_stop_strings():
    five = "\n".join("abcde")
    assert sampling_params(TASKS["dialogue"], api_values("dialogue", stop=five + "\nf")).stop[-1] == "f"
    with refused("stop_strings_own", name="stop", count=5, own=3):
        sampling_params(TASKS["dialogue"], api_values("dialogue", stop=five + "\nf", adapter=True))
    assert sampling_params(TASKS["dialogue"], api_values("dialogue", stop=five, adapter=True)).stop[-1] == "e"

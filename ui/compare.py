"""Compare, in every task tab: what differs between two runs of the tab's request under one seed
(serve/comparing.py) picked from a menu: the adapter, the steering, another of the app's models, or
one decoding setting with its other value; then both texts side by side, each under its label with
its own status line (its counts and speed). The token view (ui/tokens.py) shows both rows of tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import gradio as gr

from serve.comparing import ADAPTER, COMPARED_SETTINGS, MODEL, SETTING, STEERING, Comparison
from serve.messages import render
from serve.outcome import status_line

from .i18n import i18n

OFF = ""  # the menu's value where nothing is compared
# The menu's entries: (i18n key, value); the adapter's only in a task that has one.
KINDS = (("compare_off", OFF), ("compare_adapter", ADAPTER), ("compare_steering", STEERING),
         ("compare_model", MODEL), ("compare_setting", SETTING))


def compare_request(kind: str, model: Any, setting: Any, value: Any) -> str | None:
    """What differs, as a request names it ("adapter", "model:gpt2", "setting:top_k=40"); None: off.
    A value the box leaves empty goes as it is, for the host to refuse naming `compare`."""
    if not kind:
        return None
    if kind == MODEL:
        return f"{MODEL}:{model}"
    if kind == SETTING:
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        return f"{SETTING}:{setting}={number}"
    return kind


def other_model(names: Sequence[str], served: str) -> str:
    """The model a comparison picks first: the first of the others, or the one served where it is alone."""
    return next((name for name in names if name != served), served)


def model_choices(names: Sequence[str], served: str) -> dict:
    """The second side's model menu for the models the app has now."""
    return gr.update(choices=list(names), value=other_model(names, served))


@dataclass
class ComparePick:
    kind: gr.Dropdown
    model: gr.Dropdown
    setting: gr.Dropdown
    value: gr.Number
    model_row: gr.Row  # the model, shown while "another model" is picked
    setting_row: gr.Row  # the setting and its value, shown while "one setting" is picked
    row: gr.Row  # the two sides, shown while a kind is picked
    texts: tuple[gr.Textbox, gr.Textbox]
    statuses: tuple[gr.Markdown, gr.Markdown]

    @classmethod
    def build(cls, task: str, has_adapter: bool, names: Sequence[str], served: str,
              setting_values: dict[str, float]) -> "ComparePick":
        """Lay out the menu and what it asks for, then the two sides (`setting_values`: each setting's
        value in the tab at first, which the other value starts from)."""
        kinds = [(i18n(key), value) for key, value in KINDS if value != ADAPTER or has_adapter]
        kind = gr.Dropdown(kinds, value=OFF, label=i18n("compare"), info=i18n("compare_info"), elem_id=f"{task}-compare")
        with gr.Row(visible=False) as model_row:
            model = gr.Dropdown(list(names), value=other_model(names, served), label=i18n("compare_model_pick"),
                                info=i18n("compare_model_info"), elem_id=f"{task}-compare-model")
        with gr.Row(visible=False) as setting_row:
            setting = gr.Dropdown([(i18n(name), name) for name in COMPARED_SETTINGS], value=COMPARED_SETTINGS[0],
                                  label=i18n("compare_setting_pick"), elem_id=f"{task}-compare-setting")
            value = gr.Number(setting_values[COMPARED_SETTINGS[0]], label=i18n("compare_value"),
                              info=i18n("compare_value_info"), elem_id=f"{task}-compare-value")
        with gr.Row(visible=False, equal_height=False) as row:
            texts, statuses = [], []
            for side in ("first", "second"):
                with gr.Column(min_width=160):
                    texts.append(gr.Textbox(label=i18n(f"compare_{side}"), lines=4, interactive=False,
                                            elem_id=f"{task}-compare-{side}"))
                    statuses.append(gr.Markdown(elem_id=f"{task}-compare-{side}-status"))
        return cls(kind, model, setting, value, model_row, setting_row, row, tuple(texts), tuple(statuses))

    @property
    def inputs(self) -> list[gr.Component]:
        """What a run reads to name what differs (compare_request's arguments, in order)."""
        return [self.kind, self.model, self.setting, self.value]

    def wire(self, settings: dict[str, gr.Component], **event) -> None:
        """The menu shows what its kind asks for, and the two sides; a setting picked starts its
        other value from the tab's own (`settings`: the tab's sliders by name)."""
        def shown(kind: str) -> dict:
            return {self.row: gr.update(visible=bool(kind)), self.model_row: gr.update(visible=kind == MODEL),
                    self.setting_row: gr.update(visible=kind == SETTING)}
        self.kind.change(shown, self.kind, {self.row, self.model_row, self.setting_row}, **event)
        sliders = [settings[name] for name in COMPARED_SETTINGS]
        self.setting.input(lambda name, *values: dict(zip(COMPARED_SETTINGS, values))[name],
                           [self.setting, *sliders], self.value, **event)

    def streaming(self, texts: Sequence[str]) -> dict:
        """Both texts as they stream, the last run's status lines gone."""
        return {**dict(zip(self.texts, texts)), **{status: "" for status in self.statuses}}

    def finished(self, texts: Sequence[str], comparison: Comparison, lang: str) -> dict:
        """Both texts under their sides' labels, each side's status line (its counts and speed) under it."""
        return {**{box: gr.update(value=text, label=render(label, lang))
                   for box, text, label in zip(self.texts, texts, comparison.labels)},
                **{status: status_line(outcome, lang) for status, outcome in zip(self.statuses, comparison.outcomes)}}

    @property
    def of_the_shown_run(self) -> list[gr.Component]:
        return [*self.texts, *self.statuses]

    @staticmethod
    def forgotten() -> list:
        return ["", "", "", ""]

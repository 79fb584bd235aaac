"""Named decoding presets, kept in the browser, as text-generation-webui and LM Studio have them: in
a task tab's settings, the settings as they are saved under a name, a preset picked to set them,
one deleted. Each tab keeps its own in this browser (a gr.BrowserState per task, made at the page's
top level so that its stored value is there when the page loads) and offers two built in: the
tab's settings as it opens (the task's defaults), and greedy decoding.

A preset holds every setting of the tab's settings (ui/tab.py settings_widgets) but the seed: how
to decode, not which draw. A setting the tab gains later joins the presets saved from then on, and
one saved before it gives it the tab's own value. A preset that names a setting this version of the
app does not have (kept by another version) is applied without it, and the line under the presets
says so; one with a value a run would refuse (out of its range, say) is not applied, and the line
says why. Nothing the browser keeps can break the page: a store of another shape reads as empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from serve import Task
from serve.messages import Message, Refusal, localized, render
from serve.running import check_count, check_settings, check_size

from .i18n import i18n
from .messages import BROWSER_SECRET, PAGE_EVENT, Page, language

STORAGE_KEY = "pre-ln-gpt2-studio-presets-{task}"
BUTTON_CLASS = "preset-button"
# Save and Delete at the foot of the box beside them, at a button's own height (a row of equal
# heights stretched them to the box's).
PRESETS_CSS = f".{BUTTON_CLASS} {{ align-self: flex-end; }}\n"
LEFT_OUT = {"seed"}  # a preset is how to decode, not which draw
MAX_PRESETS = 50  # saved in one tab
MAX_NAME = 60  # characters of a preset's name
# name: (the key of its label, what it sets over the tab's settings as it opens). Greedy decoding
# takes the likeliest token at every step: the same text every run.
BUILT_IN = {"Default": ("preset_default", {}), "Greedy": ("preset_greedy", {"temperature": 0.0})}


def presets_store(task: str) -> gr.BrowserState:
    """Where this browser keeps the presets of the tab of `task`: {"presets": {name: settings}}."""
    return gr.BrowserState({"presets": {}}, storage_key=STORAGE_KEY.format(task=task), secret=BROWSER_SECRET)


def saved_presets(stored: Any) -> dict[str, Any]:
    """The presets saved in a tab's store; none where it is not a store of this app's."""
    presets = stored.get("presets") if isinstance(stored, dict) else None
    return presets if isinstance(presets, dict) else {}


def preset_choices(stored: Any, lang: str) -> list[tuple[str, str]]:
    """The dropdown's (label, name) pairs: the built-in presets, then the saved ones by name."""
    built_in = [(render(Message.keyed(label), lang), name) for name, (label, _) in BUILT_IN.items()]
    return built_in + [(name, name) for name in sorted(saved_presets(stored), key=str.casefold)]


def preset_settings(name: str, stored: Any, opening: dict[str, Any], task: Task) -> tuple[dict[str, Any], list[str]]:
    """What the preset `name` sets: each of the tab's settings (`opening`: their values as the tab
    opens, which the preset's own replace) and the names of those it holds that the tab has not.
    A Refusal where it cannot be read, or a run would refuse one of its values."""
    if name in BUILT_IN:
        preset = BUILT_IN[name][1]
    else:
        preset = saved_presets(stored).get(name)
        if not isinstance(preset, dict):
            raise Refusal("preset_unreadable", preset=name)
    settings = {**opening, **{setting: value for setting, value in preset.items() if setting in opening}}
    try:
        check_settings(task, settings)
    except Refusal as refused:
        raise Refusal("preset_refused", preset=name, error=refused.message) from None
    return settings, sorted(setting for setting in preset if setting not in opening)


def checked_name(text: Any) -> str:
    """A name to save a preset under: some text, not too long, and not a built-in preset's."""
    name = text.strip() if isinstance(text, str) else ""
    if not name:
        raise Refusal("empty", name="preset name")
    check_size("preset name", len(name), MAX_NAME)
    if name in BUILT_IN:
        raise Refusal("preset_built_in", preset=name)
    return name


def with_preset(stored: Any, name: Any, settings: dict[str, Any], task: Task) -> tuple[dict, str]:
    """The store with `settings` saved under `name` (the preset of that name replaced), and the
    name; a Refusal for a name it cannot take, a value a run would refuse, or one preset too many."""
    name = checked_name(name)
    check_settings(task, settings)
    presets = {**saved_presets(stored), name: settings}
    check_count("presets", len(presets), MAX_PRESETS)
    return {"presets": presets}, name


def without_preset(stored: Any, name: Any) -> dict:
    """The store without the preset `name`; a Refusal for none picked, or a built-in one."""
    if name in BUILT_IN:
        raise Refusal("preset_built_in", preset=name)
    if not isinstance(name, str) or name not in saved_presets(stored):
        raise Refusal("no_preset_picked")
    return {"presets": {kept: settings for kept, settings in saved_presets(stored).items() if kept != name}}


@dataclass
class Presets:
    """A tab's presets: the list to pick from, a name to save the settings under, Save and Delete,
    and a line saying what the last of them did."""
    store: gr.BrowserState
    choice: gr.Dropdown
    name: gr.Textbox
    save: gr.Button
    delete: gr.Button
    line: gr.Markdown
    applied: list = field(default_factory=list)  # the events that set the settings from a preset

    @classmethod
    def build(cls, task: str, store: gr.BrowserState) -> "Presets":
        """Lay out the parts, at the top of the tab's settings; `store`: presets_store's."""
        with gr.Row():
            choice = gr.Dropdown([], value=None, label=i18n("preset"), info=i18n("preset_info"), scale=3,
                                 min_width=200, elem_id=f"{task}-preset")
            delete = gr.Button(i18n("preset_delete"), size="md", scale=1, min_width=120, elem_classes=[BUTTON_CLASS],
                               elem_id=f"{task}-preset-delete")
        with gr.Row():
            name = gr.Textbox(label=i18n("preset_name"), placeholder=i18n("preset_name_placeholder"), max_lines=1,
                              scale=3, min_width=200, elem_id=f"{task}-preset-name")
            save = gr.Button(i18n("preset_save"), size="md", scale=1, min_width=120, elem_classes=[BUTTON_CLASS],
                             elem_id=f"{task}-preset-save")
        line = gr.Markdown(elem_id=f"{task}-preset-line")
        return cls(store, choice, name, save, delete, line)

    @property
    def buttons(self) -> list[gr.Button]:
        return [self.delete, self.save]

    def wire(self, page: Page, task: Task, settings: dict[str, gr.Component]) -> None:
        """The list filled as the page opens (its built-in names in the page's language), a preset
        applied when picked, the settings saved under a name, a preset deleted. `settings`: the
        tab's, by name; all but LEFT_OUT are a preset's."""
        kept = {name: widget for name, widget in settings.items() if name not in LEFT_OUT}
        opening = {name: widget.value for name, widget in kept.items()}

        def listed(stored, request: gr.Request) -> dict:
            return gr.update(choices=preset_choices(stored, language(request)))
        page.on_language(listed, self.choice, self.store)

        def apply(name, stored, request: gr.Request) -> dict:
            if name is None:  # the list emptied
                return gr.skip()
            lang = language(request)
            try:
                values, unknown = preset_settings(name, stored, opening, task)
            except Refusal as refused:
                return {self.line: localized(refused, lang)}
            said = (Message.keyed("preset_left_out", preset=name, names=", ".join(unknown)) if unknown
                    else Message.keyed("preset_applied", preset=name))
            return {**{kept[setting]: value for setting, value in values.items()}, self.line: render(said, lang)}

        def save(request: gr.Request, name, stored, *values) -> dict:  # Gradio puts the request first
            lang = language(request)
            try:
                stored, name = with_preset(stored, name, dict(zip(kept, values)), task)
            except Refusal as refused:
                return {self.line: localized(refused, lang)}
            return {self.store: stored, self.name: "", self.line: render(Message.keyed("preset_saved", preset=name), lang),
                    self.choice: gr.update(choices=preset_choices(stored, lang), value=name)}

        def delete(name, stored, request: gr.Request) -> dict:
            lang = language(request)
            try:
                stored = without_preset(stored, name)
            except Refusal as refused:
                return {self.line: localized(refused, lang)}
            return {self.store: stored, self.line: render(Message.keyed("preset_deleted", preset=name), lang),
                    self.choice: gr.update(choices=preset_choices(stored, lang), value=None)}

        self.applied = [self.choice.input(apply, [self.choice, self.store], {*kept.values(), self.line}, **PAGE_EVENT)]
        gr.on([self.save.click, self.name.submit], save, [self.name, self.store, *kept.values()],
              {self.store, self.name, self.line, self.choice}, **PAGE_EVENT)
        self.delete.click(delete, [self.choice, self.store], {self.store, self.line, self.choice}, **PAGE_EVENT)

"""The Steer section of every task tab: positive and negative texts (the i-th lines of the two form
a pair), the layer after which the vector is added and its strength (0: off), the presets measured
on the model they are for (scripts/steering_presets.py; docs/app.md has the table), and a line
with the vector's norm beside the residual's at that layer, once a run has computed it. The vector
goes out as files (a llama.cpp control vector and safetensors, serve/vectors.py) and comes in from
one, which then steers the runs in place of the lines until lines are typed or a preset is picked."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from serve.host import Host, ServedModel
from serve.limits import LIMITS
from serve.messages import Message, localized, render
from serve.model_host import BUNDLED
from serve.outcome import Outcome, status_line
from serve.vectors import FILE_TYPES, read_vector, write_vector_files

from .exports import newest_export
from .i18n import i18n
from .messages import language, warn

HAPPY = ("She was very happy and loved to play.\nThe day was fun and bright.\n"
         "He smiled and laughed with his friends.")
SAD = "She was very sad and cried a lot.\nThe day was bad and dark.\nHe frowned and was angry with his friends."
# {model: [(i18n key of the button, positive, negative, layer, strength)]}: only where measured.
PRESETS = {BUNDLED: [("steer_happier", HAPPY, SAD, 2, 2.0), ("steer_sadder", SAD, HAPPY, 1, 2.0)]}
EXPORT_DIR = Path(tempfile.gettempdir()) / "pre-ln-gpt2-studio" / "steering"
MAX_EXPORTS = 100  # exported vectors kept (ui/exports.py)


@dataclass
class Steer:
    positive: gr.Textbox
    negative: gr.Textbox
    layer: gr.Slider
    strength: gr.Slider
    presets: list[gr.Button]
    norm: gr.Markdown
    export: gr.Button
    upload: gr.UploadButton
    files: gr.File  # the exported vector's files, to download
    files_note: gr.Markdown  # why a file could not be made (no GGUF at layers 0 and 1), or read: a refusal
    imported: gr.State  # the record of the vector file that steers the runs (VectorFile.record); None: the lines
    imported_line: gr.Markdown  # what the imported file is: its name, hash, layer and model

    @classmethod
    def build(cls, task: str, loaded: ServedModel) -> "Steer":
        """Lay out the folded section for the model served now (its layers, its presets)."""
        n_layer = loaded.config.n_layer
        with gr.Accordion(i18n("steer"), open=False, elem_id=f"{task}-steer"):
            gr.Markdown(i18n("steer_intro"))
            with gr.Row():
                positive, negative = (gr.Textbox("", label=i18n(name), info=i18n(f"{name}_info"), lines=3,
                                                 elem_id=f"{task}-{name}") for name in ("steer_positive",
                                                                                        "steer_negative"))
            with gr.Row():
                layer = gr.Slider(0, n_layer, value=n_layer // 2, step=1, label=i18n("steer_layer"),
                                  info=i18n("steer_layer_info"), elem_id=f"{task}-steer_layer")
                strength = gr.Slider(*LIMITS["steer_strength"], value=0.0, step=0.1, label=i18n("steer_strength"),
                                     info=i18n("steer_strength_info"), elem_id=f"{task}-steer_strength")
            with gr.Row():
                presets = [gr.Button(i18n(key), size="sm", visible=loaded.name in PRESETS,
                                     elem_id=f"{task}-{key}") for key, *_ in PRESETS[BUNDLED]]
            norm = gr.Markdown(elem_id=f"{task}-steer-norm")
            with gr.Row():
                export = gr.Button(i18n("steer_export"), size="sm", elem_id=f"{task}-steer_export")
                upload = gr.UploadButton(str(i18n("steer_import")), file_types=FILE_TYPES, size="sm",
                                         elem_id=f"{task}-steer_import")
            imported_line = gr.Markdown(elem_id=f"{task}-steer-imported")
            files_note = gr.Markdown(elem_id=f"{task}-steer-files-note")
            files = gr.File(label=i18n("steer_files"), file_count="multiple", interactive=False, visible=False,
                            elem_id=f"{task}-steer-files")
        return cls(positive, negative, layer, strength, presets, norm, export, upload, files, files_note,
                   gr.State(None), imported_line)

    @property
    def inputs(self) -> dict[str, gr.Component]:
        """The section's components by API parameter name (serve.running.STEERING_PARAMS), and the
        imported file's record (steer_file, the page's own)."""
        return {"steer_positive": self.positive, "steer_negative": self.negative, "steer_layer": self.layer,
                "steer_strength": self.strength, "steer_file": self.imported}

    @property
    def buttons(self) -> list:
        return [*self.presets, self.export, self.upload]

    def wire(self, host: Host) -> None:
        """A preset fills the section (the texts, layer and strength it was measured with), and lines
        typed put an imported file away; the vector goes out as files, and comes in from one."""
        lines = [self.positive, self.negative, self.layer, self.strength]
        for button, (_, positive, negative, layer, strength) in zip(self.presets, PRESETS[BUNDLED]):
            button.click(lambda p=positive, n=negative, l=layer, s=strength: {
                **self.put_away(p, n), self.layer: l, self.strength: s}, None, {*lines, *self.by_file}, queue=False,
                api_visibility="private")
        # Typing puts an imported file away; the event leaves the boxes out of its outputs: one
        # typed in while another's event was on its way came back empty (the steering browser test
        # failed so about once in four runs on a busy machine). The file's hint goes from the empty
        # boxes once the file is gone, which only an import and then a line typed can bring about.
        for box in (self.positive, self.negative):
            box.input(lambda imported: gr.skip() if imported is None else {self.imported: None, self.imported_line: ""},
                      self.imported, [self.imported, self.imported_line], queue=False, api_visibility="private")
        self.imported.change(lambda imported: self.boxes(None, None) if imported is None else gr.skip(), self.imported,
                             [self.positive, self.negative], queue=False, api_visibility="private")
        self.export.click(self.exporter(host), [*lines, self.imported], [self.files, self.files_note],
                          api_visibility="private")
        # Queued, as a notice (gr.Warning) needs: a refused file says so beside the button too.
        self.upload.upload(self.importer(host), self.upload, {*lines, *self.by_file, self.files_note},
                           api_visibility="private")

    @property
    def by_file(self) -> list[gr.Component]:
        """What an imported file changes beside the lines: its record, its line, and the boxes' hint."""
        return [self.imported, self.imported_line, self.positive, self.negative]

    def put_away(self, positive: str | None = None, negative: str | None = None) -> dict:
        """The imported file put away: the lines steer again (these texts, where given)."""
        return {self.imported: None, self.imported_line: "", **self.boxes(positive, negative)}

    def boxes(self, positive: str | None, negative: str | None, hint: str | None = None) -> dict:
        """The lines' boxes with these texts (None: as they are), and `hint` where they are empty."""
        return {box: gr.update(placeholder=hint) if text is None else gr.update(value=text, placeholder=hint)
                for box, text in ((self.positive, positive), (self.negative, negative))}

    def exporter(self, host: Host):
        """The export button's handler: the files of the vector the section would steer by now."""
        def export(positive: str, negative: str, layer: Any, strength: Any, imported: dict | None,
                   request: gr.Request) -> dict:
            lang = language(request)
            values = {"steer_positive": positive, "steer_negative": negative, "steer_layer": layer,
                      "steer_strength": strength, "steer_file": imported}
            try:
                vector = host.steering_vector(values)
            except ValueError as refused:
                return {self.files: gr.update(value=None, visible=False),
                        self.files_note: status_line(Outcome.refused(refused), lang)}
            paths, why_not = write_vector_files(vector, newest_export(EXPORT_DIR, vector.digest[:16], MAX_EXPORTS))
            return {self.files: gr.update(value=[str(path) for path in paths], visible=True),
                    self.files_note: "" if why_not is None else render(why_not, lang)}
        return export

    def importer(self, host: Host):
        """The import button's handler: the file's vector steers the runs from now on, at its layer
        and strength (a control vector's is 1), its texts in the boxes where it has them, else its
        name as their hint; a file that is no vector, or does not fit the model served, is refused
        in the section's note on files and a notice, and what steered before still does."""
        def imported(path: str | None, request: gr.Request) -> dict:
            lang = language(request)
            try:
                file = read_vector(path, host.current.config)
            except ValueError as refused:
                warn(localized(refused, lang), lang)
                return {self.files_note: status_line(Outcome.refused(refused), lang)}
            return {self.imported: file.record, self.imported_line: render(file.imported, lang), self.files_note: "",
                    **self.boxes("\n".join(file.positive), "\n".join(file.negative),
                                 None if file.positive else file.name),
                    self.layer: file.layer, self.strength: file.strength}
        return imported

    @property
    def follows_model(self) -> list[gr.Component]:
        """What for_model changes."""
        return [self.layer, *self.presets, self.imported, self.imported_line]

    def for_model(self, loaded: ServedModel) -> dict:
        """The layer slider sized for the model now served; the presets only where they were measured;
        an imported file put away (it was fitted to the model before). Not the lines' boxes: this runs
        as the page loads too, and an update of a box then put back what was typed in its first moments."""
        n_layer = loaded.config.n_layer
        return {self.layer: gr.update(maximum=n_layer, value=n_layer // 2), self.imported: None, self.imported_line: "",
                **{button: gr.update(visible=loaded.name in PRESETS) for button in self.presets}}


def norm_line(outcome: Outcome | None, lang: str) -> str:
    """The vector's norm beside the residual's at its layer, from a run's steering (empty: none)."""
    steered = None if outcome is None else outcome.steering
    if steered is None or steered.field("norm") is None:  # none, or not measured here (a replica's, stopped)
        return ""
    norm, typical, strength = steered.field("norm"), steered.field("typical"), steered.field("strength")
    return render(Message.keyed("steer_norm", layer=steered.field("layer"), norm=norm, typical=typical,
                                strength=strength, share=abs(strength) * norm / typical if typical else 0.0), lang)

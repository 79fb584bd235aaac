"""The Steer section of every task tab: positive and negative texts (the i-th lines of the two form
a pair), the layer after which the vector is added and its strength (0: off), the presets measured
on the model they are for (scripts/steering_presets.py; docs/app.md has the table), and a line
with the vector's norm beside the residual's at that layer, once a run has computed it."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from serve.host import ServedModel
from serve.limits import LIMITS
from serve.messages import Message, render
from serve.model_host import BUNDLED
from serve.outcome import Outcome

from .i18n import i18n

HAPPY = ("She was very happy and loved to play.\nThe day was fun and bright.\n"
         "He smiled and laughed with his friends.")
SAD = "She was very sad and cried a lot.\nThe day was bad and dark.\nHe frowned and was angry with his friends."
# {model: [(i18n key of the button, positive, negative, layer, strength)]}: only where measured.
PRESETS = {BUNDLED: [("steer_happier", HAPPY, SAD, 2, 2.0), ("steer_sadder", SAD, HAPPY, 1, 2.0)]}


@dataclass
class Steer:
    positive: gr.Textbox
    negative: gr.Textbox
    layer: gr.Slider
    strength: gr.Slider
    presets: list[gr.Button]
    norm: gr.Markdown

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
        return cls(positive, negative, layer, strength, presets, norm)

    @property
    def inputs(self) -> dict[str, gr.Component]:
        """The section's components by API parameter name (serve.running.STEERING_PARAMS)."""
        return {"steer_positive": self.positive, "steer_negative": self.negative, "steer_layer": self.layer,
                "steer_strength": self.strength}

    def wire(self) -> None:
        """A preset fills the section (the texts, layer and strength it was measured with)."""
        for button, (_, positive, negative, layer, strength) in zip(self.presets, PRESETS[BUNDLED]):
            button.click(lambda p=positive, n=negative, l=layer, s=strength: (p, n, l, s), None,
                         [self.positive, self.negative, self.layer, self.strength], queue=False,
                         api_visibility="private")

    def for_model(self, loaded: ServedModel) -> dict:
        """The layer slider sized for the model now served; the presets only where they were measured."""
        n_layer = loaded.config.n_layer
        return {self.layer: gr.update(maximum=n_layer, value=n_layer // 2),
                **{button: gr.update(visible=loaded.name in PRESETS) for button in self.presets}}


def norm_line(outcome: Outcome | None, lang: str) -> str:
    """The vector's norm beside the residual's at its layer, from a run's steering (empty: none)."""
    steered = None if outcome is None else outcome.steering
    if steered is None:
        return ""
    norm, typical, strength = steered.field("norm"), steered.field("typical"), steered.field("strength")
    return render(Message.keyed("steer_norm", layer=steered.field("layer"), norm=norm, typical=typical,
                                strength=strength, share=abs(strength) * norm / typical if typical else 0.0), lang)

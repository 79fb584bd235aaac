"""The Generate tab: a prompt the model continues, as a notebook (Continue joins each run's text to it)."""
from __future__ import annotations

import gradio as gr

from serve.apis import GENERATE_API

from ..i18n import i18n
from ..tab import TaskView, Widgets, output_box


def generate_widgets() -> Widgets:
    prompt = gr.Textbox(label=i18n("prompt"), placeholder=i18n("prompt_placeholder"), lines=4,
                        elem_id="generate-prompt")
    return Widgets({"prompt": prompt}, output_box("continuation", 8, "generate"))


GENERATE = TaskView(
    api=GENERATE_API,
    label="tab_generate", run_label="generate", intro="intro_generate", build=generate_widgets,
    # Examples are chosen by trying them on the bundled model with the tab's defaults and several seeds:
    # it learned from children's stories, so story openings are what it continues best.
    examples=[["Once upon a time, there was a little fox who"],
              ["One day, a little girl named Mia found a"],
              ["Tom and his dog went to the park. They"]],
    example_inputs=("prompt",), notebook="prompt",
)

"""A slider for picking one of a model's layers or heads (the Architecture tab's live view).

Its own module because Gradio writes a type stub (`.pyi`) next to the module of every Component
subclass it imports: here that stub is a copy of these few lines (git ignores it)."""
import gradio as gr


class PickSlider(gr.Slider):
    """A slider whose value reaches the event's function as it was typed, even out of range, for
    that function to hold or refuse it in its tab's status line, as the task tabs refuse. Gradio's
    own check would answer with an error toast, in English, and a traceback in the log. The browser
    draws it as a plain slider (is_template)."""
    is_template = True

    def preprocess(self, payload):
        return payload

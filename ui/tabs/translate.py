"""The Translate tab: a text, its two languages (⇄ swaps them), and the example pairs the prompt
is made of."""
from __future__ import annotations

import gradio as gr

from serve import DEFAULT_EXAMPLES, LANGUAGES, goes_through_english
from serve.apis import TRANSLATE_API
from serve.comparing import ADAPTER
from serve.messages import LABELS_ZH

from ..compare import OFF
from ..i18n import i18n
from ..last_run import LastRun
from ..tab import PAGE_EVENT, Tab, TaskView, Widgets, output_box
from ..tokens import Insight


EXAMPLE_LINES, EXAMPLE_MAX_LINES = 4, 12  # the pairs box's height where a run sends them
# Gradio sizes a text box to its text once, in an inline height it keeps when the box's lines
# change: let go of it, so that the box takes the height its new lines give it.
FIT_PAIRS_BOX_JS = "() => { const box = document.querySelector('#translate-examples textarea'); " \
                   "if (box) box.style.height = ''; }"
# Where the pairs are not sent, the box is UNSENT_LINES high and its space under the text is a
# border rather than padding, so that the lines past its height stay out of sight instead of
# showing half a line there; its last line fades out, the usual sign that more lies below.
# (Where they are sent the box grows with them, by Gradio's own measure.)
TRANSLATE_CSS = """
#translate-examples.pairs-unsent textarea { padding-bottom: 0; border-bottom: 10px solid transparent;
  mask-image: linear-gradient(to bottom, #000 40%, transparent); }
"""
UNSENT_LINES = 2  # and where it does not


def example_lines(pairs) -> str:
    """Example pairs as the text box shows them: one `source = target` a line."""
    return "\n".join(f"{source} = {target}" for source, target in pairs)


def translate_widgets() -> Widgets:
    source_text = gr.Textbox(label=i18n("source_text"), placeholder=i18n("source_text_placeholder"), lines=2,
                             elem_id="translate-text")
    languages = [(i18n(language), language) for language in LANGUAGES]
    with gr.Row(equal_height=True):
        # Narrow enough that the three stay on one line on a phone: ⇄ between the two it swaps.
        source = gr.Dropdown(languages, value="English", label=i18n("source_language"), min_width=100,
                             elem_id="translate-source")
        swap = gr.Button("⇄", scale=0, min_width=48, elem_id="translate-swap")
        target = gr.Dropdown(languages, value="French", label=i18n("target_language"), min_width=100,
                             elem_id="translate-target")
    examples = gr.Textbox(example_lines(DEFAULT_EXAMPLES["English", "French"]), lines=EXAMPLE_LINES,
                          max_lines=EXAMPLE_MAX_LINES,
                          label=i18n("example_pairs"), info=i18n("example_pairs_info"), elem_id="translate-examples")
    inputs = {"text": source_text, "source": source, "target": target, "examples": examples}
    last_pair = gr.State((source.value, target.value))  # the pair before a dropdown's change: choose_pair
    return Widgets(inputs, output_box("translation", 2, "translate"), more={"swap": swap, "last_pair": last_pair})


BUILT_IN_EXAMPLES = {example_lines(pairs) for pairs in DEFAULT_EXAMPLES.values()}


def users_own(examples: str) -> bool:
    """Whether the example pairs box holds pairs the user wrote (not empty, not built in)."""
    return bool(examples.strip()) and examples not in BUILT_IN_EXAMPLES


def turned_round(lines: str) -> str:
    """Example pairs for the other direction: each `source = target` line as `target = source`;
    a line that is not a pair stays as it was."""
    def turned(line: str) -> str:
        source, equals, target = line.partition("=")
        return f"{target.strip()} = {source.strip()}" if equals and source.strip() and target.strip() else line
    return "\n".join(turned(line) for line in lines.splitlines())


def choose_pair(changed: str, source: str, target: str, last: tuple[str, str], examples: str,
                adapter_on: bool = False, comparing: bool = False):
    """A language picked in one dropdown. Picking the other side's language swaps the two (as
    translation apps do) rather than leaving a pair that cannot run; the example pairs follow
    the new pair. Pairs the user wrote are turned round where the direction is (⇄, or the other
    side's language picked), and kept as they are for another pair, their hint then saying so
    (they may be in the old pair's languages)."""
    picked = source, target
    if picked == tuple(last):  # the other dropdown's change, fired by this one's answer: done already
        return {"source": gr.update(), "target": gr.update(), "last": last, "examples": gr.update()}
    if source == target:
        source, target = (source, last[0]) if changed == "source" else (last[1], target)
    pairs = DEFAULT_EXAMPLES.get((source, target))
    if users_own(examples) and (source, target) == tuple(reversed(last)):
        examples_update = turned_round(examples)
    elif users_own(examples):  # said where they can be edited; while locked, the hint says why
        examples_update = gr.update(info=i18n("example_pairs_kept")) if sends_pairs(adapter_on, comparing) \
            else gr.update()
    elif pairs is None or example_lines(pairs) == examples:
        examples_update = gr.update()
    else:  # the box's change puts its hint back (translate_extras)
        examples_update = example_lines(pairs)
    # Only what changes goes back: the swapped dropdown fires its own change, and an answer that
    # repeated every value could arrive after the user typed into a box, and undo it.
    return {"source": gr.update() if source == picked[0] else source,
            "target": gr.update() if target == picked[1] else target,
            "last": (source, target), "examples": examples_update}


def turned_boxes(source: str, target: str, text: str, translation: str,
                 last_run: LastRun) -> tuple[str, str] | None:
    """⇄, as translation apps have it: where the two boxes hold a run's text and its translation
    (either way round, in the languages `source` and `target` as they were), the two change places,
    setting up the way back in one click, with nothing written lost: the new (text, translation).
    A text edited since, a refused one, or an example picked since keeps its place (None): only
    the languages change."""
    shown = (last_run.given("text"), last_run.given("source"), last_run.given("target"), last_run.output)
    if translation.strip() and shown in ((text, source, target, translation), (translation, target, source, text)):
        return translation, text
    return None


def sends_pairs(adapter_on: bool, compare: str) -> bool:
    """Whether a run sends the example pairs: with the adapter off, or to the off side of a
    comparison of the adapter (`compare`: ui/compare.py's menu)."""
    return not adapter_on or compare == ADAPTER


def pairs_sent(adapter_on: bool, compare: str, source: str = "", target: str = "") -> dict:
    """The example pairs box, editable only where a run sends the pairs, its hint saying which;
    where they are not sent it is two lines high, so that on a phone it does not stand a screen's
    half between the text and the Translate button. For French <-> German the hint says that the
    built-in pairs shown are not the ones sent (tasks.translation.through_english)."""
    sent = sends_pairs(adapter_on, compare)
    hint = ("example_pairs_through_english" if goes_through_english(source, target) else "example_pairs_info") \
        if sent else "example_pairs_unsent"
    return gr.update(interactive=sent, info=i18n(hint),
                     lines=EXAMPLE_LINES if sent else UNSENT_LINES,
                     max_lines=EXAMPLE_MAX_LINES if sent else UNSENT_LINES,
                     elem_classes=[] if sent else ["pairs-unsent"])


def translate_extras(tab: Tab) -> None:
    inputs = tab.widgets.inputs
    source, target, examples = inputs["source"], inputs["target"], inputs["examples"]
    last_pair = tab.widgets.more["last_pair"]
    # The pairs are sent only with the adapter off (or on the off side of a comparison): locked
    # otherwise, and the hint says why, so that editing them does not look as if it changed anything.
    starting = pairs_sent(tab.adapter.value, OFF)
    for name in ("interactive", "info", "lines", "max_lines", "elem_classes"):
        setattr(examples, name, starting[name])
    switches = [tab.adapter, tab.insight.compare.kind]
    gr.on([tab.adapter.change, tab.insight.compare.kind.change], pairs_sent, [*switches, source, target], examples,
          **PAGE_EVENT).then(None, js=FIT_PAIRS_BOX_JS)
    # The hint that the user's own pairs were kept goes once the box holds none.
    examples.change(lambda text, *on: gr.skip() if users_own(text) else pairs_sent(*on),
                    [examples, *switches, source, target], examples, **PAGE_EVENT)
    text, output = inputs["text"], tab.widgets.output

    def moved(source_value: str, target_value: str, text_value: str, translation: str, last_run: LastRun) -> dict:
        """The boxes turned round where they hold a run (turned_boxes), and what spoke of that run
        as it was shown cleared: the status line, the prompt sent, and the token view with its
        alternatives (a continuation from them would write over the text now in the output box).
        The run's record stays, its line gone, so that ⇄ again turns the boxes back."""
        turned = turned_boxes(source_value, target_value, text_value, translation, last_run)
        if turned is None:
            return {}
        return {text: turned[0], **tab.faded(False, value=turned[1]), **tab.shown(last_run.with_outcome(None), "en"),
                tab.prompt_sent: "", **dict(zip(tab.insight.of_the_shown_run, Insight.forgotten()))}

    def swap(source_value: str, target_value: str, text_value: str, translation: str, last_run: LastRun):
        return {source: target_value, target: source_value,
                **moved(source_value, target_value, text_value, translation, last_run)}

    def pick(changed: str):
        """A language picked in one dropdown (choose_pair); where that was the other side's
        language, the languages swap as with ⇄, and so do a run's text and translation."""
        def picked(source_value, target_value, last, examples_value, adapter_on, comparing, text_value, translation,
                   last_run):
            chosen = choose_pair(changed, source_value, target_value, last, examples_value, adapter_on, comparing)
            boxes = moved(*last, text_value, translation, last_run) if source_value == target_value else {}
            return {source: chosen["source"], target: chosen["target"], last_pair: chosen["last"],
                    examples: chosen["examples"], **boxes}
        return picked

    run_shown = [text, output]
    changes = {text, output, tab.status, tab.last_run, tab.prompt_sent, *tab.insight.of_the_shown_run}
    tab.widgets.more["swap"].click(swap, [source, target, *run_shown, tab.last_run], {source, target, *changes},
                                   **PAGE_EVENT)
    for changed, dropdown in (("source", source), ("target", target)):
        dropdown.change(pick(changed), [source, target, last_pair, examples, *switches, *run_shown, tab.last_run],
                        {source, target, last_pair, examples, *changes}, **PAGE_EVENT)


# One a direction, drawn from the validation split by a rule rather than picked for what the model
# makes of them (train.data.translation_examples; tests/test_bundled.py checks they are its output).
TRANSLATE_EXAMPLES = [("Tom was accepted to Harvard.", "English", "French"),
                      ("We laugh a lot.", "English", "German"),
                      ("Je les ai appelés.", "French", "English"),
                      ("Ich bin so überarbeitet.", "German", "English"),
                      ("Bonsoir, tout le monde !", "French", "German"),  # through English
                      ("Zeigen Sie mir eine andere Tasche.", "German", "French")]

TRANSLATE = TaskView(
    api=TRANSLATE_API,
    label="tab_translate", run_label="run_translate", intro="intro_translate", build=translate_widgets,
    bundled_note="bundled_translate",
    examples=[list(example) for example in TRANSLATE_EXAMPLES],
    example_inputs=("text", "source", "target"),
    example_labels={"en": [f"{source} → {target}: {text}" for text, source, target in TRANSLATE_EXAMPLES],
                    "zh": [f"{LABELS_ZH[source]} → {LABELS_ZH[target]}：{text}"
                           for text, source, target in TRANSLATE_EXAMPLES]},
    extras=translate_extras,
)

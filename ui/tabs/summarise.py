"""The Summarise tab: an article, how much of the context its prompt takes, and its summary."""
from __future__ import annotations

from typing import Callable

import gradio as gr

from serve.apis import SUMMARIZE_API
from serve.messages import localized, render
from serve.host import Host

from ..i18n import i18n
from ..messages import language
from ..tab import Tab, TaskView, Widgets, output_box


def summarize_widgets() -> Widgets:
    article = gr.Textbox(label=i18n("article"), placeholder=i18n("article_placeholder"), lines=10, max_lines=20,
                         elem_id="summarize-article")
    length = gr.Markdown(elem_id="summarize-length")
    return Widgets({"article": article}, output_box("summary", 3, "summarize"), more={"length": length})


def article_length(host: Host) -> Callable[[str, float, bool], str]:
    """How much of the context the article's prompt takes, and whether it will be cut to fit."""
    def length_line(article: str, max_new_tokens: float, adapter: bool, request: gr.Request) -> str:
        if not article.strip():
            return ""
        lang = language(request)
        try:
            parts = host.article_room(article, int(max_new_tokens), adapter)
        except ValueError as error:  # too long to send, say: what a run would answer
            return localized(error, lang)
        return " · ".join(render(part, lang) for part in parts)
    return length_line


def summarize_extras(tab: Tab) -> None:
    article, max_new_tokens = tab.widgets.inputs["article"], tab.settings["max_new_tokens"]
    gr.on([article.change, max_new_tokens.change, tab.adapter.change], article_length(tab.host),
          [article, max_new_tokens, tab.adapter], tab.widgets.more["length"], queue=False,
          trigger_mode="always_last", api_visibility="private")


FOX_AND_CROW = (
    "A crow found a piece of cheese and flew up into a tree to eat it. A fox saw her and wanted the cheese "
    "for himself. \"What a beautiful bird you are,\" said the fox. \"Your feathers shine like silver. If your "
    "voice is as fine as your feathers, you must be the queen of all birds.\" The crow was so pleased that she "
    "opened her beak to sing. The cheese fell to the ground, and the fox ate it at once. \"Your voice is fine "
    "indeed,\" he said, \"but you should not believe everyone who praises you.\"")
ANT_AND_DOVE = (
    "An ant went to the river to drink and fell into the water. A dove sitting in a tree saw the ant struggling. "
    "She dropped a leaf into the river, and the ant climbed onto it and floated safely to the bank. A few days "
    "later a hunter came to catch the dove with a net. The ant saw him and bit his foot. The hunter cried out, "
    "the dove heard him and flew away. One good turn deserves another.")

# A conversation like the Schema-Guided Dialogue ones the bundled model learnt to summarise (what
# the user asked for), written for this tab; tests/test_bundled.py checks that it does.
DINNER_BOOKING = (
    "User: Hi, I need a table for dinner tonight.\nAssistant: Which city are you in?\nUser: San Jose, please. "
    "Something Italian.\nAssistant: How about Pasta Bella in San Jose?\nUser: That sounds good. Book it for 7 pm "
    "for two people.\nAssistant: Confirming a table for 2 at Pasta Bella in San Jose today at 7 pm.\nUser: Yes, "
    "that's right.\nAssistant: Your table has been booked. Anything else?\nUser: No, thank you.")

SUMMARIZE = TaskView(
    api=SUMMARIZE_API,
    label="tab_summarize", run_label="run_summarize", intro="intro_summarize", build=summarize_widgets,
    bundled_note="bundled_summarize",
    examples=[[FOX_AND_CROW], [ANT_AND_DOVE], [DINNER_BOOKING]],
    example_inputs=("article",),
    example_labels={"en": ["The fox and the crow", "The ant and the dove", "Booking dinner (a conversation)"],
                    "zh": ["狐狸和乌鸦", "蚂蚁和鸽子", "订晚餐（一段对话）"]},
    extras=summarize_extras,
)

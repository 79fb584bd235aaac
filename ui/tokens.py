"""The token view: a run's output as its tokens, coloured by their probability. Pointing at a token
shows its probability and the alternatives at that step, after the decoding settings as they were
applied; clicking it offers those alternatives to continue from (ui/tab.py). With Compare on, two
rows, one a side (ui/compare.py), under one seed: the first token where they part is marked, and
each token shows its probability under the other side too where both sides share a tokenizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import gradio as gr

from serve.inspection import as_text, readable
from serve.limits import LIMITS
from serve import Task
from serve.comparing import COMPARED_SETTINGS, Comparison
from serve.messages import Message, Refusal, render, said
from serve.running import TOP_SHOWN

from .compare import ComparePick
from .i18n import i18n
from .last_run import LastRun
from .messages import language


TEMPLATE = """
<div class="token-view">
  {{#each value.rows}}
  <div class="token-row" data-row="{{this.row}}">
    <div class="token-row-label">{{this.label}}</div>
    <div class="token-row-tokens">{{#each this.tokens}}<span class="tok {{this.mark}}" data-row="{{this.row}}"
      data-i="{{this.i}}" title="{{this.title}}" style="background-color: {{this.color}}">{{this.text}}</span>{{/each}}</div>
  </div>
  {{/each}}
  <div class="token-view-note">{{value.note}}</div>
</div>
"""
CSS = """
.token-view { font-family: var(--font-mono); font-size: 14px; line-height: 1.9; }
.token-row { margin-bottom: 0.5em; }
.token-row-label { font-size: 12px; opacity: 0.7; }
.tok { border-radius: 3px; padding: 1px 0; cursor: pointer; white-space: pre-wrap; }
.tok:hover { outline: 1px solid var(--color-accent); }
.tok.diverges { outline: 2px solid #d33; }
.tok.selected { outline: 2px solid var(--color-accent); }
.token-view-note { font-size: 12px; opacity: 0.7; }
/* A finger, not a pointer: each token a target of its own, tall enough, and never narrower than
   a letter (a comma alone was 8 px wide). */
@media (max-width: 768px) {
  .token-row-tokens { line-height: 2.5; }
  .tok { display: inline-block; min-width: 1.2em; padding: 0.35em 0.1em; line-height: 1.4; text-align: center; }
}
"""
# A click on a token tells the server which one (row, index) and outlines it, so that the
# alternatives listed below say which of several alike tokens they are for; hovering shows its title.
JS = """
element.addEventListener('click', (event) => {
  const token = event.target.closest('.tok');
  if (!token) return;
  element.querySelectorAll('.tok.selected').forEach((other) => other.classList.remove('selected'));
  token.classList.add('selected');
  trigger('click', {row: Number(token.dataset.row), index: Number(token.dataset.i)});
});
"""
EMPTY = {"rows": [], "note": ""}


def token_view(elem_id: str) -> gr.HTML:
    return gr.HTML(EMPTY, html_template=TEMPLATE, css_template=CSS, js_on_load=JS, elem_id=elem_id)


def literal(text: str) -> str:
    """Text as the view's template must be given it to show it as it is: the template reads a
    backslash as the start of an escape ("\\n" a newline, "\\" nothing at all), so each is doubled."""
    return text.replace("\\", "\\\\")


def shown(entry: dict) -> str:
    """A token of Result.logprobs as text a person can read inline: a newline made visible, a
    piece of a character written as its bytes."""
    return as_text(entry["bytes"]).replace("\n", "↵\n") or "∅"


def listed(entry: dict) -> str:
    """A token of Result.logprobs in a list of tokens (a tooltip, the alternatives), written as
    the Architecture tab writes it."""
    return readable(as_text(entry["bytes"])) or "∅"


def percent(logprob: float) -> str:
    return f"{100 * math.exp(logprob):.3g}%"


def colour(logprob: float) -> str:
    """Green for a likely token, through yellow, to red for an unlikely one."""
    p = math.exp(logprob)
    return f"hsla({120 * p:.0f}, 70%, 50%, 0.35)"


def row_of(entries: list[dict], label: str, row: int, other: list[float] | None = None,
           diverges_at: int | None = None, other_label: str = "") -> dict:
    """One row of the view: each token with its title (probability, the other side's, and the
    alternatives) and colour."""
    tokens = []
    for i, entry in enumerate(entries):
        lines = [f"{listed(entry)}: {percent(entry['logprob'])}"]
        if other is not None and i < len(other):
            lines.append(f"{other_label}: {percent(other[i])}")
        lines += [f"  {listed(alt)} {percent(alt['logprob'])}" for alt in entry["top"][:TOP_SHOWN]]
        tokens.append({"text": literal(shown(entry)), "title": literal("\n".join(lines)),
                       "color": colour(entry["logprob"]), "i": i, "row": row,
                       "mark": "diverges" if i == diverges_at else ""})
    return {"label": label, "row": row, "tokens": tokens}


def clicked_token(event: gr.EventData) -> tuple[int | None, int | None]:
    """The (row, index) that the view's click names (JS: its trigger's data), as the event's
    attributes; (None, None) where it names none."""
    try:
        return event.row, event.index
    except (AttributeError, TypeError):  # no data, or not a token's
        return None, None


@dataclass
class Insight:
    """The parts of a task tab that show why the model said what it said: the adapter's strength,
    the token view, Compare (ui/compare.py), and the alternatives of a clicked token to continue from."""
    adapter_scale: gr.Slider
    show_tokens: gr.Checkbox
    compare: ComparePick
    view: gr.HTML
    alternatives: gr.Radio

    @classmethod
    def build(cls, task: Task, adapter_on: bool, names: Sequence[str], served: str) -> "Insight":
        """Lay out the parts; call inside the tab, below the adapter switch (`adapter_on`: its value;
        `names`: the models a comparison may pick, `served` the one served)."""
        has_adapter = task.adapter is not None
        adapter_scale = gr.Slider(*LIMITS["adapter_scale"], value=1.0, step=0.05, label=i18n("adapter_scale"),
                                  info=i18n("adapter_scale_info"), visible=has_adapter,  # a task without one
                                  interactive=adapter_on, elem_id=f"{task.name}-adapter_scale")
        with gr.Accordion(i18n("look_inside_output"), open=False, elem_id=f"{task.name}-insight"):
            # On from the start: a person opens this section after a run has surprised them, and a
            # view that asks for the run again has lost it (it costs a run ~no time).
            show_tokens = gr.Checkbox(True, label=i18n("show_tokens"), info=i18n("show_tokens_info"),
                                      elem_id=f"{task.name}-show-tokens")
            compare = ComparePick.build(task.name, has_adapter, names, served,
                                        {name: getattr(task.defaults, name) for name in COMPARED_SETTINGS})
            view = token_view(f"{task.name}-tokens")
            alternatives = gr.Radio([], label=i18n("alternatives"), info=i18n("alternatives_info"), visible=False,
                                    elem_id=f"{task.name}-alternatives")
        return cls(adapter_scale, show_tokens, compare, view, alternatives)

    def wire(self, last_run: gr.State, settings: dict[str, gr.Component]) -> None:
        """Compare's menu and sides (`settings`: the tab's sliders); a click on a token of the tab's
        `last_run` (LastRun) offers its alternatives."""
        self.compare.wire(settings, queue=False, api_visibility="private")
        self.view.click(self.offer_alternatives, last_run, [last_run, self.alternatives], queue=False,
                        api_visibility="private")

    @staticmethod
    def offer_alternatives(last_run: LastRun, event: gr.EventData, request: gr.Request = None):
        """The clicked token, selected in the last run, and its alternatives to continue from, under
        a label that names the token (the list shows below the text, far from it on a phone)."""
        row, index = clicked_token(event)
        entry = last_run.token(row, index)
        if entry is None:
            return gr.skip()
        def choice(alt: dict) -> str:  # the one the run drew is marked: the others are what it could have been
            return f"{listed(alt)} {percent(alt['logprob'])}" + (DRAWN_MARK if alt["id"] == entry["id"] else "")
        offered = entry["top"][:TOP_SHOWN]
        if all(alt["id"] != entry["id"] for alt in offered):  # a sampled token less likely than those: last
            offered = [*offered, entry]
        choices = [(choice(alt), alt["id"]) for alt in offered]
        label = render(Message.keyed("alternatives_to", index=index + 1, token=listed(entry)), language(request))
        return (replace(last_run, selected=(row, index)),
                gr.update(choices=choices, value=None, visible=True, label=label))

    @staticmethod
    def continue_from(last_run: LastRun, alternative: int | None) -> tuple[dict, list, Message]:
        """The values to continue the last run from its selected token with `alternative` in its
        place (that run's inputs, settings and seed, whatever the boxes say now), the entries shown
        before the new tokens, and the status line's note that says what was chosen."""
        if last_run.selected is None or alternative is None:
            raise Refusal("pick_alternative")
        at, index = last_run.selected  # a token of this run's own rows (offer_alternatives)
        row = last_run.rows[at]
        chosen = next((alt for alt in [*row.entries[index]["top"], row.entries[index]] if alt["id"] == alternative),
                      None)
        if chosen is None:
            raise Refusal("pick_alternative")
        shown_before = row.entries[:index] + [{**chosen, "top": row.entries[index]["top"]}]
        values = {**last_run.values, **row.asked, "forced": [entry["id"] for entry in shown_before]}
        return values, shown_before, Message.keyed("continued_from", index=index + 1, token=listed(chosen))

    @staticmethod
    def single(entries: list[dict], adapter: bool, asked: bool, lang: str) -> dict:
        """The view of one run's tokens (`asked`: with Show tokens on)."""
        if not entries:
            return {"rows": [], "note": render(NO_TOKENS_KEPT if asked else NO_TOKENS_NOTE, lang)}
        label = said("adapter on" if adapter else "output", lang)
        return {"rows": [row_of(entries, label, 0)], "note": render(TOKENS_NOTE, lang)}

    @staticmethod
    def compared(comparison: Comparison, lang: str, texts: list[str]) -> dict:
        """Both rows of a comparison (serve/comparing.py), under its sides' labels, the first token
        where they part marked on each; `texts`: the two outputs as shown, which the task's tidying
        (Summarise's sentences, a reply's spaces) can make the same where the tokens differ."""
        labels = [render(label, lang) for label in comparison.labels]
        rows = [row_of(comparison.entries[side], labels[side], side, comparison.under_other[side],
                       comparison.diverges_at[side], labels[1 - side]) for side in (0, 1)]
        return {"rows": rows, "note": render(parting_note(comparison, texts), lang)}

    @property
    def of_the_shown_run(self) -> list[gr.Component]:
        """What speaks of the last run as its output box shows it: the token view, Compare's two
        sides, and a clicked token's alternatives (the run's record stays: the token it has
        selected is read only with one of these alternatives, which go with their choice)."""
        return [self.view, *self.compare.of_the_shown_run, self.alternatives]

    @classmethod
    def forgotten(cls) -> list:
        """The values of of_the_shown_run once the output they spoke of has gone."""
        return [EMPTY, *ComparePick.forgotten(), cls.hidden_alternatives()]

    @staticmethod
    def hidden_alternatives() -> dict:
        """The alternatives put away, their choice with them: a value left without its choices
        would be refused as the next run's input."""
        return gr.update(choices=[], value=None, visible=False)


def parting_note(comparison: Comparison, texts: list[str]) -> Message:
    """What the token view says of where a comparison's two sides part: at a token, or (models of
    two tokenizers) at a character of the text and a token of each."""
    at = comparison.diverges_at
    if comparison.same:
        return Message.keyed("same")
    if comparison.by_text:
        return Message.keyed("differ_from_character", character=comparison.character + 1, first=at[0] + 1,
                             second=at[1] + 1)
    if texts[0] == texts[1]:
        return Message.keyed("same_text_differ_from", index=at[0] + 1)
    return Message.keyed("differ_from", index=at[0] + 1)


DRAWN_MARK = " ✓"  # after the alternative a run drew
TOKENS_NOTE = Message.keyed("tokens_note")
NO_TOKENS_NOTE = Message.keyed("no_tokens")
NO_TOKENS_KEPT = Message.keyed("no_tokens_kept")

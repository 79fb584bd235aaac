"""One function, `task_tab`, builds the tab of every task: the task's own components come from
its `TaskView`; everything else (the run button and Stop, decoding settings, adapter switch, status
line, prompt sent, examples, copy button) is the same for all and is built here."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

import gradio as gr

from serve import Task
from serve.admission import Waiting
from serve.comparing import ADAPTER, Comparison, side_outcome
from serve.messages import Message, render
from serve.host import Host, ServedModel
from serve.model_host import BUNDLED
from serve.outcome import FAULT, Outcome, status_line
from serve.running import (MAX_CHARS, RANDOM_SEED, SETTING_RANGES, SETTINGS, STOP_PARAM, StopSwitches, TaskAPI,
                           drawn_seed)

from .compare import compare_request
from .i18n import i18n
from .last_run import LastRun, TokenRow
from .messages import PAGE_EVENT, Page, language, word
from .presets import Presets
from .steer import Steer, norm_line
from .tokens import TOP_SHOWN, Insight

# A refused run leaves the last result where it was (a typo costs no output), faded, since it no
# longer answers the inputs above it (the status line says why nothing new came).
LAST_RUN_CLASS = "from-last-run"
# A folded section's title that wraps (a phone's "Why this output" one) reads from the left, and its
# arrow keeps its own size beside it, inside the section: Gradio stretches it to the title's height,
# and turned, that height becomes its width.
TAB_CSS = f"""
button.label-wrap {{ text-align: left; align-items: center; gap: 0.75em; }}
button.label-wrap > .icon {{ flex: none; }}
.{LAST_RUN_CLASS} textarea, .{LAST_RUN_CLASS} .tok {{ opacity: 0.45; }}
"""
# What a handler that changes nothing returns: Gradio takes an empty {component: value} dict for
# one value, and a lone skip leaves every output as it is.
NOTHING = gr.skip()
GENERATION = "generation"  # the concurrency group of every request that runs the model
# Every event that runs the model: Gradio starts it at once, and the run waits for its turn in the
# host's queue (serve/admission.py), where the page's runs and /v1's go in the order they came.
# (Held back by Gradio's workers, the page's waited four to six times as long as /v1's under load.)
GENERATION_EVENT = dict(concurrency_id=GENERATION, concurrency_limit=None)
STOP_WAIT_S = 5.0  # how long Stop waits for the run to show its partial text before dropping it
GENERATING = str(i18n("generating"))  # a status the browser translates
BUTTON_MIN_WIDTH = 90  # three run buttons side by side on a 390 px phone
SLIDER_STEPS = {"temperature": 0.05, "top_p": 0.01, "min_p": 0.01, "typical_p": 0.01, "repetition_penalty": 0.05,
                "presence_penalty": 0.05, "frequency_penalty": 0.05}
SETTINGS_WITH_INFO = {"temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "no_repeat_ngram_size"}
# Ctrl+Enter (⌘+Enter on a Mac) in any box of a tab presses its run button, as in notebooks and
# text-generation-webui: a multi-line box, such as Generate's prompt, keeps Enter for a new line.
# Every tab's panel is `tab-{name}` and its run button `{name}-run` (the Architecture tab's too).
RUN_SHORTCUT_JS = """() => {
  document.addEventListener("keydown", (event) => {
    // Not while an input method composes (Safari ends it with keyCode 229), nor a key held down,
    // nor in Chat's box for editing a message, where Enter saves the edit (ui/tabs/chat.py, EDIT_KEYS_JS).
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey) || event.isComposing || event.keyCode === 229
        || event.repeat || !event.target.closest || event.target.closest("#dialogue-chatbot")) return;
    const panel = event.target.closest('[id^="tab-"]');
    const run = panel && panel.querySelector(`#${panel.id.slice(4)}-run`);
    if (run && !run.disabled) {
      event.preventDefault();
      run.click();
    }
  });
}"""


def output_box(label: str, lines: int, task_name: str) -> gr.Textbox:
    """A task's output, laid out by the tab under its run buttons (render=False here)."""
    return gr.Textbox(label=i18n(label), lines=lines, interactive=False, buttons=["copy"],
                      elem_id=f"{task_name}-output", render=False)


@dataclass(frozen=True)
class Widgets:
    """The components a view lays out for its task."""
    inputs: dict[str, gr.Component]  # by API parameter name
    output: gr.Component
    submit: tuple[gr.Textbox, ...] = ()  # text boxes where Enter runs the task
    cleared: tuple[gr.Component, ...] = ()  # emptied once a run shows its first text (Compare: its result)
    more: dict[str, gr.Component] = field(default_factory=dict)  # anything else the view's extras wire


@dataclass(frozen=True)
class TaskView:
    """What one task's tab shows and takes beyond what every tab has."""
    api: TaskAPI
    label: str  # i18n key of the tab
    run_label: str  # i18n key of the run button
    intro: str  # i18n key of the line at the tab's top that says what the tab does
    build: Callable[[], Widgets]
    examples: list[list[Any]]  # one value per name in example_inputs
    example_inputs: tuple[str, ...]
    # The examples' labels by language ("en", and "zh" where they have words to translate): needed
    # with several inputs, whose table headers the browser cannot translate; it does not translate
    # these either, so a page's load sets them in its language (labelled_examples).
    example_labels: dict[str, list[str]] | None = None
    from_ui: Callable[[dict[str, Any]], dict[str, Any]] = dict  # component values -> API values
    present: Callable[[dict[str, Any], str], Any] = lambda values, text: text  # -> output's value
    extras: Callable[["Tab"], None] | None = None  # wires the task's own events
    notebook: str | None = None  # the input that Continue appends each run's text to (Generate's prompt)
    page_state: Callable[[], gr.Component] | None = None  # makes a state to keep at the page's top level
    # i18n key of a line under the intro on how the bundled model does at the task: it says
    # nothing of another model, so it shows only while the bundled one is served (serves_bundled)
    bundled_note: str | None = None

    @property
    def task(self) -> Task:
        return self.api.task


@dataclass
class Tab:
    view: TaskView
    page: Page
    host: Host
    stop_switches: StopSwitches
    widgets: Widgets
    settings: dict[str, gr.Component]
    adapter: gr.Checkbox
    run_button: gr.Button
    continue_button: gr.Button | None  # where the view has a notebook
    stop_button: gr.Button
    status: gr.Markdown  # the last run's outcome's line (serve/outcome.status_line)
    last_run: gr.State  # the tab's LastRun: what every handler that speaks of the last run reads
    prompt_sent: gr.Textbox
    insight: "Insight"
    examples: gr.Examples
    steer: Steer
    presets: Presets
    page_state: gr.Component | None = None  # the view's state kept at the page's top level (Chat's)
    bundled_note: gr.Markdown | None = None  # TaskView.bundled_note's line
    # The events that run the task, by name: "run" (the run button, Enter), "from_token" (an
    # alternative picked in the token view), and the view's own ("continue", Chat's "retry", "edit").
    runs: dict[str, list] = field(default_factory=dict)

    @property
    def named_inputs(self) -> dict[str, gr.Component]:
        """Every component a run reads, by API parameter name: the endpoint's own, as an API call
        sends them (the adapter's only where the task has one)."""
        adapter = {} if self.view.task.adapter is None else {"adapter": self.adapter,
                                                              "adapter_scale": self.insight.adapter_scale}
        return {**self.widgets.inputs, **self.settings, **adapter, **self.steer.inputs}

    @property
    def run_buttons(self) -> tuple[gr.Button, ...]:
        """Run, and Continue where the view has it: held while a run goes."""
        return (self.run_button,) if self.continue_button is None else (self.run_button, self.continue_button)

    @property
    def buttons(self) -> list[gr.Button]:
        """Every button the tab lays out (the page test holds the page to this list)."""
        return [*self.run_buttons, self.stop_button, *self.presets.buttons, *self.steer.buttons,
                *(c for c in self.widgets.more.values() if isinstance(c, (gr.Button, gr.DownloadButton,
                                                                          gr.UploadButton)))]

    def held(self, busy: bool) -> dict:
        """The run buttons waiting while a run goes (busy), or pressable again; Stop red while there
        is something to stop (a run waiting for its turn too), and grey otherwise (it stays
        pressable: a run Gradio has not started yet, which has not turned it red, can be stopped too)."""
        return {**{button: gr.update(interactive=not busy) for button in self.run_buttons},
                self.stop_button: gr.update(variant="stop" if busy else "secondary")}

    def shown(self, last_run: LastRun, lang: str) -> dict:
        """The last run kept, and its outcome's status line."""
        return {self.last_run: last_run, self.status: status_line(last_run.outcome, lang)}

    def faded(self, faded: bool, **change) -> dict:
        """The output box and its tokens (Why this output) faded (LAST_RUN_CLASS) or not, with any
        other `change` to the box; a conversation (Chat) never is: it is not one run's answer."""
        if isinstance(self.widgets.output, gr.Chatbot):
            return {self.widgets.output: gr.update(**change)} if change else {}
        classes = [LAST_RUN_CLASS] if faded else []
        return {self.widgets.output: gr.update(**change, elem_classes=classes),
                self.insight.view: gr.update(elem_classes=classes)}

    @property
    def all_runs(self) -> list:
        """Every event that runs the task, whatever its name: Stop cancels them all."""
        return [event for events in self.runs.values() for event in events]

    def ended(self, last_run: LastRun, outcome: Outcome, lang: str) -> dict:
        """A run that did not run (refused, or failed): its line, and the run buttons back; what the
        user typed and `last_run`, the run before it, stay (a typo costs no output), its result faded."""
        return {**self.shown(last_run.with_outcome(outcome), lang), **self.held(False), **self.faded(True)}

    def add_run(self, name: str, triggers: list,
                prepare: Callable[[dict[str, Any]], dict[str, Any]] = lambda values: values,
                continuing: bool = False, appends: bool = False, when: gr.State | None = None) -> list:
        """Run the task when any of `triggers` fires (or, for an event's dependency, once it has
        run), on the tab's values made ready by `prepare` (Chat's retry, for one, first takes back
        the last turn); the events are kept as runs[`name`], and returned. `continuing`: from the
        token chosen in the token view, with the alternative chosen there (Insight), on the inputs
        and settings of the run it comes from. `appends`: the run's text joins the notebook (Continue).
        `when`: a state that says whether the dependency before it asks for a run (Chat's edit of
        the user's message does, of a reply does not); without it, every trigger runs."""
        insight = self.insight
        # The tab's run buttons wait while a run goes, as a chat app's Send does: a Continue
        # pressed meanwhile would join a text to the prompt that the running one joins too.
        outputs = {self.widgets.output, self.status, self.last_run, self.prompt_sent, insight.view,
                   *insight.compare.of_the_shown_run, insight.alternatives, *self.widgets.cleared, *self.run_buttons,
                   self.stop_button, self.steer.norm}
        reads = {*self.named_inputs.values(), insight.show_tokens, *insight.compare.inputs, self.last_run,
                 insight.alternatives, *([when] if when is not None else [])}
        handler = dict(fn=self.run_handler(prepare, continuing, appends, when), inputs=reads, outputs=outputs,
                       show_progress="minimal", api_visibility="private", **GENERATION_EVENT)
        listeners = [trigger for trigger in triggers if not isinstance(trigger, gr.events.Dependency)]
        events = [gr.on(listeners, **handler)] if listeners else []
        # A handler that readies the tab first (Chat's edit): the run goes after it.
        events += [before.then(**handler) for before in triggers if isinstance(before, gr.events.Dependency)]
        for event in events:  # Compare's two prompts, or a long notebook's, end below the box's height
            event.then(None, js=scrolled_to_end(self.prompt_sent.elem_id), **PAGE_EVENT)
        self.runs[name] = events
        return events

    def run_handler(self, prepare: Callable[[dict[str, Any]], dict[str, Any]], continuing: bool, appends: bool,
                    when: gr.State | None = None):
        """The run's handler (add_run): the run made ready, then streamed into the tab."""
        def run_in_tab(data: dict[gr.Component, Any], request: gr.Request):
            if when is not None and not data[when]:  # nothing asked to run: the tab stays as it is
                yield NOTHING
                return
            lang, last_run = language(request), data[self.last_run]
            try:
                run = self.ready_run(data, prepare, continuing, appends)
            except ValueError as refused:  # the inputs as made ready: the last run and its output stay
                yield self.ended(last_run, Outcome.refused(refused), lang)
                return
            # The last run's status line goes at once: under a new run it would pass for this one's.
            yield {self.status: GENERATING, **self.held(True), **self.faded(False)}
            try:
                with self.stop_switches.running(request.session_hash, self.view.task.name) as cancel:
                    yield from (self.compared(run, cancel, lang) if run.comparing else self.single(run, cancel, lang))
            except gr.Error:
                raise
            except Exception as error:  # one outside the generation itself: said as a fault
                outcome = Outcome.fault(f"the {self.view.task.name} tab", error)
                yield self.ended(last_run, outcome, lang)
                raise notice(outcome, lang) from None
        return run_in_tab

    def ready_run(self, data: dict[gr.Component, Any], prepare: Callable[[dict[str, Any]], dict[str, Any]],
                  continuing: bool, appends: bool) -> "ReadyRun":
        """The run's values from the tab's inputs (ValueError: refused before it starts)."""
        view, insight = self.view, self.insight
        values = prepare(view.from_ui({name: data[component] for name, component in self.named_inputs.items()}))
        shown_before, notes = [], []
        if continuing:
            values, shown_before, continued = insight.continue_from(data[self.last_run], data[insight.alternatives])
            notes.append(continued)
        values["seed"] = drawn_seed(values["seed"])  # drawn here, so that the run keeps it to continue from
        ran_with = dict(values)
        if view.notebook and (appends or continuing):  # a text the app itself has grown
            values[view.notebook], cut = notebook_tail(values[view.notebook], MAX_CHARS[view.notebook])
            notes += [cut] if cut else []
        asked_tokens = bool(data[insight.show_tokens] or continuing)
        if asked_tokens:
            values["logprobs"] = TOP_SHOWN
        compare = None if continuing else compare_request(*(data[part] for part in insight.compare.inputs))
        if compare is not None:  # what differs between the two sides (serve/comparing.py)
            values["compare"] = compare
        return ReadyRun(values, ran_with, shown_before, notes, asked_tokens, compare is not None, appends,
                        data[self.last_run])

    def single(self, run: "ReadyRun", cancel, lang: str):
        """One run's updates as its text streams, and its outcome, tokens and prompt at its end."""
        view, insight, output = self.view, self.insight, self.widgets.output
        cleared = {box: "" for box in self.widgets.cleared}
        for update in self.host.run(view.api, run.values, cancel, waiting=True):
            if isinstance(update, Waiting):
                yield {self.status: waiting_line(update, lang)}
                continue
            text, outcome, prompt, logprobs = update
            if outcome is None:
                yield {output: view.present(run.values, text), **cleared}
            elif not outcome.ran:
                yield from self.refused_or_failed(run.before, outcome, lang)
            else:
                for note in run.notes:
                    outcome = outcome.noted(note)
                entries = run.shown_before + logprobs
                adapter = run.values.get("adapter", False)
                ran = LastRun(outcome, run.ran_with, text, (TokenRow(entries),), run.appends)
                yield {output: view.present(run.values, text), **self.shown(ran, lang), self.prompt_sent: prompt,
                       self.steer.norm: norm_line(outcome, lang),
                       insight.view: insight.single(entries, adapter, run.asked_tokens, lang),
                       insight.alternatives: insight.hidden_alternatives(), **cleared, **self.held(False)}

    def compared(self, run: "ReadyRun", cancel, lang: str):
        """A comparison's updates: both sides' texts as they stream, then the side a run without
        Compare would show in the output box (Comparison.shown), both prompts, and both rows of
        tokens, under labels that say what differs."""
        view, insight = self.view, self.insight
        for update in self.host.run_compare(view.api, run.values, cancel, waiting=True):
            if isinstance(update, Waiting):
                yield {self.status: waiting_line(update, lang)}
                continue
            texts, outcome, comparison = update
            if outcome is None:
                yield insight.compare.streaming(texts)
            elif not outcome.ran:
                yield from self.refused_or_failed(run.before, outcome, lang)
            else:
                shown = texts[comparison.shown]
                rows = tuple(map(TokenRow, comparison.entries, comparison.asked))
                other = 1 - comparison.shown
                ran = LastRun(outcome, run.ran_with, shown, rows, run.appends,
                              other=(texts[other], side_outcome(comparison, other)))
                yield {self.widgets.output: view.present(run.values, shown), **self.shown(ran, lang),
                       self.prompt_sent: both_prompts(comparison, lang),
                       insight.view: insight.compared(comparison, lang, texts),
                       **insight.compare.finished(texts, comparison, lang),
                       self.steer.norm: norm_line(outcome, lang),
                       insight.alternatives: insight.hidden_alternatives(),
                       **{box: "" for box in self.widgets.cleared}, **self.held(False)}

    def refused_or_failed(self, last_run: LastRun, outcome: Outcome, lang: str):
        """A run that ended without running: said in the tab, then, for a fault, as a notice too."""
        yield self.ended(last_run, outcome, lang)
        if outcome.kind == FAULT:
            raise notice(outcome, lang)


@dataclass(frozen=True)
class ReadyRun:
    """A run made ready from the tab's inputs (Tab.ready_run)."""
    values: dict[str, Any]  # as sent to the host
    ran_with: dict[str, Any]  # as the run keeps them to be continued from (the notebook uncut)
    shown_before: list[dict]  # a continued run's tokens before the new ones
    notes: list[str]  # for the status line: the token continued from, a notebook cut to fit
    asked_tokens: bool
    comparing: bool
    appends: bool
    before: LastRun  # the tab's last run, which stays should this one not run


def waiting_line(waiting: Waiting, lang: str) -> str:
    """The status line while a run waits for its turn in the queue: its place; once its turn has
    come, that it generates."""
    return GENERATING if waiting.place == 0 else render(waiting.message, lang)


def notice(outcome: Outcome, lang: str) -> gr.Error:
    """A fault's notice, beside its status line."""
    return gr.Error(render(outcome.message, lang), title=word("error", lang), print_exception=False)


def both_prompts(comparison: Comparison, lang: str) -> str:
    """What Compare sent, side by side in one box: each side's prompt under its label."""
    return "\n\n".join(f"[{render(label, lang)}]\n{prompt}" for label, prompt in zip(comparison.labels,
                                                                                    comparison.prompts))


def rewind(name: str, text: str, last_run: LastRun):
    """The notebook as the last run found it, if that run's text joined it and the user has not
    changed it since; otherwise as it is."""
    given = last_run.given(name)
    if last_run.appended and given is not None and text == given + last_run.output:
        return given
    return gr.skip()


def join_pending(name: str, text: str, last_run: LastRun) -> tuple[str, LastRun]:
    """The notebook `name`'s text with a Generate run's output (LastRun.pending) joined where it
    belongs: after the text that run continued, and before anything the user has added to the end
    of it since; the output is dropped if that text itself was changed (an example picked, say).
    Taken either way (appended)."""
    pending = last_run.pending(name)
    if pending is None:
        return text, last_run
    given, output = pending
    taken = replace(last_run, appended=True)
    return (given + output + text[len(given):] if text.startswith(given) else text), taken


def without_refusal(tab: Tab):
    """The outcome once an example is picked: a refusal's goes (most speak of an input the example
    replaces; any other is said again by the next run), and the fade it gave the output with it; a
    run's stays with its seed."""
    def forget(last_run: LastRun):
        if last_run.outcome is None or last_run.outcome.ran:
            return NOTHING
        return {**tab.shown(last_run.with_outcome(None), "en"), **tab.faded(False)}
    return forget




def scrolled_to_end(elem_id: str) -> str:
    """JavaScript that shows the end of a text box once Gradio has drawn its new value: Gradio's own
    autoscroll keeps a box that grew past its height at the top when the value arrives whole."""
    return (f"() => requestAnimationFrame(() => requestAnimationFrame(() => {{ "
            f"const box = document.querySelector('#{elem_id} textarea'); if (box) box.scrollTop = box.scrollHeight; }}))")


def notebook_tail(text: str, limit: int) -> tuple[str, Message | None]:
    """The end of a notebook that Continue has grown past what a run takes, and a note that says
    so (None: it fits). A model sees only the end of a long prompt anyway (the task cuts it to
    the context), and a refusal there would stop a notebook the app itself made too long."""
    if len(text) <= limit:
        return text, None
    return text[-limit:], Message.keyed("notebook_tail", kept=limit, characters=len(text))


def append_run(text: str, last_run: LastRun) -> str:
    """`text` with the last run's output after it, once the run has ended done."""
    ran = last_run.outcome is not None and last_run.outcome.ran
    return text + last_run.output if ran and last_run.output else text


def serves_bundled(loaded: ServedModel) -> bool:
    """Whether the model served is the bundled one, which the tabs' notes on it speak of."""
    return loaded.name == BUNDLED


def adapter_props(task: Task, loaded: ServedModel) -> dict[str, Any]:
    """The adapter switch's state for this task and model: on where the checkpoint's evaluation
    found its adapter better than the prompt alone; off and greyed out, with the reason as its
    info, when there is no adapter to switch on."""
    if task.adapter is None:
        return dict(value=False, interactive=False, info=i18n("no_adapter_task"))
    if task.adapter not in loaded.adapters:
        return dict(value=False, interactive=False, info=i18n("no_adapter_model") + f" ({task.adapter})")
    on = task.adapter in loaded.adapters_on
    return dict(value=on, interactive=True, info=i18n("adapter_info" if on else "adapter_info_off"))


def strength_live(adapter_on: bool, compare: str) -> dict:
    return gr.update(interactive=adapter_on or compare == ADAPTER)


def settings_widgets(task: Task) -> dict[str, gr.Component]:
    """Sliders for the decoding settings, spanning the ranges the app accepts, set to the task's
    defaults; the stop strings the run adds to the task's own; and the seed."""
    widgets = {}
    for name, kind in SETTINGS:
        low, high = SETTING_RANGES[name]
        widgets[name] = gr.Slider(low, high, value=getattr(task.defaults, name), label=i18n(name),
                                  step=1 if kind is int else SLIDER_STEPS[name], elem_id=f"{task.name}-{name}",
                                  info=i18n(f"{name}_info") if name in SETTINGS_WITH_INFO else None)
    # (not "{task}-stop": that is the tab's Stop button)
    widgets[STOP_PARAM.name] = gr.Textbox(value=STOP_PARAM.default, label=i18n("stop_strings"), lines=2,
                                          info=stop_strings_info(task), elem_id=f"{task.name}-stop-strings")
    # -1, not None: gradio draws an empty box as 0 once its accordion opens, and 0 is a fixed seed.
    # No precision: with precision=0 gradio rounded a typed 1.5 to seed 2 without a word; now the
    # run is refused and says that the seed must be an integer.
    widgets["seed"] = gr.Number(value=RANDOM_SEED, label=i18n("seed"), info=i18n("seed_info"),
                                elem_id=f"{task.name}-seed")
    return widgets


def stop_strings_info(task: Task) -> str:
    """The stop strings box's hint: how to write them, and the task's own, which always apply (and
    whether its adapter adds the line end), written as the box takes them. (One translated text:
    the browser translates only the first of several in one string.)"""
    own = task.defaults.stop
    if not own:
        return i18n("stop_strings_info")
    adapter_adds = task.adapter is not None and set(task.stops(adapter_on=True)) != set(own)
    return (i18n("stop_strings_info_own_adapter" if adapter_adds else "stop_strings_info_own")
            + ", ".join(json.dumps(stop, ensure_ascii=False) for stop in own))


def labelled_examples(view: TaskView, widgets: Widgets, page: Page) -> gr.Examples:
    """The view's examples, under labels in the page's language."""
    labels = view.example_labels or {}
    examples = gr.Examples(view.examples, [widgets.inputs[name] for name in view.example_inputs],
                           label=i18n("examples"), example_labels=labels.get("en"), cache_examples=False,
                           api_visibility="private")
    if "zh" in labels:
        def in_language(request: gr.Request):
            return gr.Dataset(sample_labels=labels.get(language(request), labels["en"]))
        page.on_language(in_language, examples.dataset)
    return examples


def task_tab(view: TaskView, page: Page, host: Host, stop_switches: StopSwitches, presets_store: gr.BrowserState,
             page_state: gr.Component | None = None) -> Tab:
    """Lay out and wire one task's tab; call inside the page's gr.Blocks. `presets_store` (the tab's
    presets, ui/presets.py) and `page_state` (the view's state, TaskView.page_state): made at the
    page's top level."""
    with gr.Tab(i18n(view.label), id=view.task.name, elem_id=f"tab-{view.task.name}"):
        tab = laid_out(view, page, host, stop_switches, presets_store, page_state)
        wire_runs(tab)
        if view.extras is not None:
            view.extras(tab)
    wire_stop(tab)
    return tab


def laid_out(view: TaskView, page: Page, host: Host, stop_switches: StopSwitches, presets_store: gr.BrowserState,
             page_state: gr.Component | None) -> Tab:
    """The tab's components, top to bottom, and its states."""
    task = view.task
    gr.Markdown(i18n(view.intro), elem_id=f"{task.name}-intro")
    bundled_note = (gr.Markdown(i18n(view.bundled_note), visible=serves_bundled(host.current),
                                elem_id=f"{task.name}-bundled-note") if view.bundled_note else None)
    widgets = view.build()
    run_button, continue_button, stop_button = run_row(view)
    if not widgets.output.is_rendered:  # input, run, output: the button in reach on a phone's first screen
        widgets.output.render()
    status, last_run = gr.Markdown(elem_id=f"{task.name}-status"), gr.State(LastRun())
    adapter_now = adapter_props(task, host.current)
    adapter = gr.Checkbox(label=i18n("adapter"), **adapter_now, visible=task.adapter is not None,
                          elem_id=f"{task.name}-adapter")
    insight = Insight.build(task, adapter_now["value"], host.names, host.current.name)
    with gr.Accordion(i18n("settings"), open=False):
        presets = Presets.build(task.name, presets_store)
        settings = settings_widgets(task)
    steer = Steer.build(task.name, host.current)
    with gr.Accordion(i18n("prompt_sent"), open=False) as prompt_folded:
        prompt_sent = gr.Textbox(label=i18n("prompt_sent"), show_label=False, lines=4, max_lines=12,
                                 interactive=False, buttons=["copy"], elem_id=f"{task.name}-prompt-sent")
    # its end, where the prompt asks the model (and Compare's second prompt), in view when unfolded too
    prompt_folded.expand(None, js=scrolled_to_end(prompt_sent.elem_id), **PAGE_EVENT)
    examples = labelled_examples(view, widgets, page)
    return Tab(view, page, host, stop_switches, widgets, settings, adapter, run_button, continue_button, stop_button,
               status, last_run, prompt_sent, insight, examples, steer, presets, page_state, bundled_note)


def run_row(view: TaskView) -> tuple[gr.Button, gr.Button | None, gr.Button]:
    """The run button, Continue where the view has a notebook, and Stop (Tab.held)."""
    name = view.task.name
    with gr.Row():  # BUTTON_MIN_WIDTH: one row on a phone too (Gradio's 160 px stacked them)
        run_button = gr.Button(i18n(view.run_label), variant="primary", min_width=BUTTON_MIN_WIDTH,
                               elem_id=f"{name}-run")
        continue_button = (gr.Button(i18n("continue"), variant="secondary", min_width=BUTTON_MIN_WIDTH,
                                     elem_id=f"{name}-continue") if view.notebook else None)
        stop_button = gr.Button(i18n("stop"), variant="secondary", min_width=BUTTON_MIN_WIDTH, elem_id=f"{name}-stop")
    return run_button, continue_button, stop_button


def wire_runs(tab: Tab) -> None:
    """The runs every task tab has, and what goes with them."""
    # A refusal spoke of the input an example has just replaced; a run's line stays (its seed).
    tab.examples.load_input_event.then(without_refusal(tab), tab.last_run,
                                       {tab.status, tab.last_run, tab.widgets.output, tab.insight.view}, **PAGE_EVENT)
    tab.add_run("run", [tab.run_button.click] + [box.submit for box in tab.widgets.submit])
    if tab.continue_button is None:
        tab.add_run("from_token", [tab.insight.alternatives.input], continuing=True)
    else:
        wire_notebook(tab)
    tab.insight.wire(tab.last_run, tab.settings)
    tab.presets.wire(tab.page, tab.view.task, tab.settings)
    # The strength acts only on an adapter that runs: switched on, or the on side of a comparison.
    compare = tab.insight.compare.kind
    gr.on([tab.adapter.change, compare.change], strength_live, [tab.adapter, compare], tab.insight.adapter_scale,
          **PAGE_EVENT)
    tab.steer.wire(tab.host)


def wire_notebook(tab: Tab) -> None:
    """Notebook: the run's text joins the input itself, which stays editable, so one can write,
    continue, correct, continue; a refused run (no seed line) leaves it as it was. A Generate
    run's text, shown but not yet in the input, joins it before Continue goes on, if the input is
    still the one it continues (not an example picked since, say). Continuing from a chosen token
    starts again from the input that run was given: a Continue run's text is taken back out of
    the input first, and the new text waits to join it as a Generate run's does."""
    name, last_run = tab.view.notebook, tab.last_run
    notebook = tab.widgets.inputs[name]
    rewound = tab.insight.alternatives.input(partial(rewind, name), [notebook, last_run], notebook, **PAGE_EVENT)
    tab.add_run("from_token", [rewound], continuing=True)
    joined = tab.continue_button.click(partial(join_pending, name), [notebook, last_run], [notebook, last_run],
                                       **PAGE_EVENT)
    for run in tab.add_run("continue", [joined], appends=True):
        appended = run.then(append_run, [notebook, last_run], notebook, **PAGE_EVENT)
        appended.then(None, js=scrolled_to_end(notebook.elem_id), **PAGE_EVENT)  # where the new text is


def wire_stop(tab: Tab) -> None:
    """Stop first asks the run to end, so that it shows its partial text and a status saying
    "Stop pressed" (a run still waiting for its turn leaves the queue, saying so); only then does
    Gradio cancel the run's event, which ends one that did not end in time. A run cancelled so
    never says it has ended: the run buttons come back with Stop."""
    def stop(request: gr.Request):
        tab.stop_switches.stop(request.session_hash, tab.view.task.name, STOP_WAIT_S)

    tab.stop_button.click(stop, **PAGE_EVENT).then(
        lambda: tab.held(False), None, {*tab.run_buttons, tab.stop_button}, cancels=tab.all_runs, queue=False,
        api_visibility="private")

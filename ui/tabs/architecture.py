"""The Architecture tab: the Pre-LN and Post-LN blocks side by side, the measurements of
`python -m train.lab` (docs/img), and a live look inside the loaded model for the user's prompt."""
from __future__ import annotations

import contextvars
import math
import re
from pathlib import Path

import gradio as gr
from gradio.components.plot import PlotData
import matplotlib
import pandas as pd
from matplotlib import font_manager
from matplotlib.figure import Figure  # not pyplot: figures made per request must not pile up in its registry
from matplotlib.patches import Rectangle

from serve.inspection import Inspection, LogitLens
from serve.messages import PLOT_TEXT, TOP_HEADERS, TRACE_LINE, said
from serve.host import Host
from serve.outcome import Outcome, status_line
from serve.tracing import Trace

from ..i18n import ENGLISH, i18n
from ..messages import Page, language
from ..pick_slider import PickSlider


def slider_top(count: int) -> int:
    """A slider's maximum for picking one of `count` layers or heads. Gradio refuses a slider
    whose maximum is its minimum, so a one-layer model gets 2, which checked_slider holds to 1."""
    return max(count, 2)


IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"

# The seed article's pseudocode, corrected: GPT-2 ends with ln_f, and a Pre-LN residual addition
# normalises nothing.
PRE_LN = """def pre_ln_block(h):
    h = h + attention(ln_1(h))   # Add: the sum stays unnormalised
    h = h + mlp(ln_2(h))         # Add
    return h

def gpt2(ids):
    h = wte[ids] + wpe[positions]
    for block in blocks:
        h = pre_ln_block(h)
    h = ln_f(h)                  # the final LayerNorm
    return h @ wte.T             # logits"""
POST_LN = """def post_ln_block(h):
    h = ln_1(h + attention(h))   # Add & Normalize
    h = ln_2(h + mlp(h))         # Add & Normalize
    return h

def transformer(ids):
    h = wte[ids] + wpe[positions]
    for block in blocks:
        h = post_ln_block(h)
    # no ln_f: the last block already ends in a LayerNorm
    return h @ wte.T             # logits"""

# The plots label tokens, which may be Chinese, Japanese or Korean; DejaVu Sans, matplotlib's
# own font, has none of their glyphs (they were drawn as boxes). matplotlib takes a glyph it lacks
# from the next font of font.family, so any installed font of these joins it (packages.txt
# installs WenQuanYi Micro Hei on a Space).
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
             "Droid Sans Fallback", "Microsoft YaHei", "PingFang SC", "Hiragino Sans GB", "SimHei")


def plot_fonts() -> list[str]:
    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *(name for name in CJK_FONTS if name in installed)]


matplotlib.rcParams["font.family"] = plot_fonts()

EXAMPLE_PROMPT = "Once upon a time, a little fox found a shiny key in the forest. She"


def residual_norm_figure(seen: Inspection, model_name: str, lang: str = "en") -> Figure:
    text = PLOT_TEXT[lang]
    norms = seen.residual_norms.numpy()
    stages = ["emb", *map(str, range(1, len(norms) - 1)), "ln_f"]
    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    ax.fill_between(stages, norms.min(1), norms.max(1), alpha=0.25, label=text["range"])
    ax.plot(stages, norms.mean(1), marker="o", label=text["mean"])
    ax.plot(stages, norms[:, -1], marker=".", linestyle="--", label=text["last"])
    ax.set(yscale="log", xlabel=text["after_layer"], ylabel="||h||", title=text["norm_title"].format(model=model_name))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def attention_figure(seen: Inspection, lang: str = "en") -> Figure:
    text = PLOT_TEXT[lang]
    size = 2.5 + 0.22 * len(seen.tokens)
    fig = Figure(figsize=(size + 1.2, size))
    ax = fig.subplots()
    image = ax.imshow(seen.attention.numpy(), cmap="viridis", vmin=0, vmax=1)
    ticks = range(len(seen.tokens))
    ax.set_xticks(ticks, seen.tokens, rotation=90, fontsize=8, parse_math=False)  # tokens are text: "$" too
    ax.set_yticks(ticks, seen.tokens, fontsize=8, parse_math=False)
    ax.set(xlabel=text["key"], ylabel=text["query"],
           title=text["attention_title"].format(layer=seen.layer + 1, head=seen.head + 1))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def in_a_cell(label: str, most: int = 8) -> str:
    """A token label cut to fit a lens cell, with an ellipsis that says so (" directl" would pass
    for a token), never inside a byte's escape (\\xf0 is a byte, \\xf not)."""
    return label if len(label) <= most else re.sub(r"\\(x[0-9a-f]?)?$", "", label[:most - 1]) + "…"


LENS_COLUMNS = 20  # tokens a row of the lens at most: a longer prompt wraps onto more rows, each with its layer axis


def lens_figure(lens: LogitLens, adapter: str | None, lang: str = "en") -> Figure:
    """Layers (rows) x positions (columns): each layer's likeliest next token, coloured by its
    probability; with an adapter, the cells where it changes the top-1 are outlined. A prompt of
    more than LENS_COLUMNS tokens wraps onto further grids below, of as many tokens each as can be,
    so that the figure stays as wide as a page and its text stays readable, where one long grid
    would be shrunk to fit."""
    text = PLOT_TEXT[lang]
    layers, positions = lens.probabilities.shape
    rows = math.ceil(positions / LENS_COLUMNS)
    columns = math.ceil(positions / rows)  # rows as even as they come: 21 tokens are 11 and 10, not 20 and 1
    # Wide enough for its title however few the tokens.
    fig = Figure(figsize=(max(2 + 0.6 * columns, 4.5), 0.5 + (0.9 + 0.42 * layers) * rows
                          + (0.3 if adapter else 0)), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    for ax, start in zip(axes, range(0, positions, columns)):
        shown = range(start, min(start + columns, positions))
        image = ax.imshow(lens.probabilities[:, start:shown.stop].numpy(), cmap="Blues", vmin=0, vmax=1,
                          aspect="auto", origin="lower", extent=(-0.5, len(shown) - 0.5, -0.5, layers - 0.5))
        ax.set_xlim(-0.5, columns - 0.5)  # a last, shorter row keeps the cells' width
        for layer, row in enumerate(lens.top_tokens):
            for column, position in enumerate(shown):
                p = float(lens.probabilities[layer, position])
                ax.text(column, layer, in_a_cell(row[position]), ha="center", va="center", fontsize=7, parse_math=False,
                        color="white" if p > 0.6 else "black")
                if lens.changed is not None and lens.changed[layer, position]:
                    ax.add_patch(Rectangle((column - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red",
                                           linewidth=1.5))
        # tokens are text: "$" too
        ax.set_xticks(range(len(shown)), [lens.tokens[p] for p in shown], rotation=90, fontsize=8, parse_math=False)
        ax.set_yticks(range(layers), [str(i + 1) for i in range(layers)], fontsize=8)
        ax.set_ylabel(text["layer"])
    title = text["lens_title"] + ("\n" + text["lens_adapter"].format(adapter=adapter) if adapter else "")
    axes[0].set_title(title)
    axes[-1].set_xlabel(text["after_token"])
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label=text["probability"])
    return fig


NO_ADAPTER = "none"
DRAWN = ("norms", "attention", "top", "lens")  # the live view's parts that show a prompt

# On a narrow screen the logit lens keeps the size it was drawn at and scrolls sideways: shrunk to
# a phone's width, a grid of one token per column had text too small to read.
# A phone hides a scroll bar until one scrolls, so a line above each such figure says it scrolls.
ARCHITECTURE_CSS = """
.swipe-hint { display: none; }
@media (max-width: 768px) {
  #architecture-lens .matplotlib, .measurement .image-frame { display: block; overflow-x: auto; }
  #architecture-lens .matplotlib img { max-width: none; width: auto; margin: 0; }
  .measurement .image-frame img { max-width: none; width: 760px; height: auto; }
  /* the figure's buttons (full screen, download) in a band of their own, off its title */
  .measurement .image-frame { margin-top: 2.5rem; }
  .swipe-hint { display: block; }
  /* no figure (a refused prompt): nothing to swipe */
  .swipe-hint:has(+ #architecture-lens .empty) { display: none; }
}
"""


def swipe_hint() -> None:
    """On a narrow screen only: the figure below is wider than the screen (ARCHITECTURE_CSS)."""
    gr.Markdown(i18n("swipe_sideways"), elem_classes="swipe-hint")


def look_inside(host: Host):
    """The live view's run: by the name of each part it changes (norms, attention, top, layer,
    head, lens), the part's new value, and its outcome (refused: the outcome, and None for each
    part drawn: DRAWN)."""
    def run(prompt: str, layer: float, head: float, adapter: str = NO_ADAPTER,
            request: gr.Request | None = None) -> dict:
        adapter = None if adapter in (None, NO_ADAPTER) else adapter
        try:
            view = host.look_inside(prompt, layer, head, adapter)
        except ValueError as error:  # said in the tab's status line, as the task tabs say a refusal
            # The plots go: left under another prompt, they passed for its.
            return {**dict.fromkeys(DRAWN), "outcome": Outcome.refused(error)}
        seen = view.seen
        lang = language(request)
        top = pd.DataFrame([[token, f"{100 * p:.3g}%"] for token, p in seen.top_tokens],  # a random model's are tiny
                           columns=TOP_HEADERS[lang])
        return {"norms": residual_norm_figure(seen, view.model, lang), "attention": attention_figure(seen, lang),
                "top": top,
                "layer": gr.update(maximum=slider_top(view.layers), value=seen.layer + 1),
                "head": gr.update(maximum=slider_top(view.heads), value=seen.head + 1),
                "lens": lens_figure(view.lens, adapter, lang), "outcome": None}
    return run


# The trace's example: the bundled model's likeliest next token after it is " loved", and noise on
# the name takes most of its probability away (0.58 to 0.19), which the name's own position and
# the last token's later layers bring back.
TRACE_EXAMPLE = "Once upon a time, there was a little girl named Lily. She"
TRACE_EXAMPLE_SPAN = "Lily"
TRACE_GRIDS = {"residual": "grid", "attention": "attention", "mlp": "mlp"}  # a heatmap's name: its Trace field


def trace_figure(trace: Trace, kind: str, lang: str = "en") -> Figure:
    """One of a trace's grids (TRACE_GRIDS) as a heatmap: rows the clean prompt's tokens (the noised
    ones starred, as ROME marks them), columns the layers. A diverging map centred on 0, whose
    range holds -1..1 and any effect beyond it: white is no effect, red brings the answer back,
    blue takes it further away. Sized to be read at a phone's width for a model of a dozen layers."""
    text = PLOT_TEXT[lang]
    effects = getattr(trace, TRACE_GRIDS[kind]).numpy()
    positions, layers = effects.shape
    reach = max(1.0, float(abs(effects).max()))
    fig = Figure(figsize=(2.3 + min(0.3 * layers, 4.5), 1.4 + 0.24 * positions), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(effects, cmap="RdBu_r", vmin=-reach, vmax=reach, aspect="auto")
    noised = set(trace.noised)
    labels = [in_a_cell(token, 12) + (" *" if position in noised else "") for position, token in enumerate(trace.tokens)]
    ax.set_yticks(range(positions), labels, fontsize=9, parse_math=False)  # tokens are text: "$" too
    step = math.ceil(layers / 16)  # a 48-layer model's numbers every third layer, not on top of each other
    ax.set_xticks(range(0, layers, step), [str(layer + 1) for layer in range(0, layers, step)], fontsize=9)
    ax.set_xlabel(text["layer"])
    ax.set_ylabel(text["token_noised" if noised else "token"])
    ax.set_title(text[f"trace_{TRACE_GRIDS[kind]}"] + "\n" + text["trace_effect"].format(answer=trace.answer),
                 fontsize=10, parse_math=False)
    fig.colorbar(image, ax=ax, label=text["effect"], shrink=min(1.0, 0.4 + 0.06 * positions))
    return fig


def markdown_text(text: str) -> str:
    """Text said as it is in Markdown: a token may be "*" or "`"."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~])", r"\\\1", text)


TRACED = (*TRACE_GRIDS, "probabilities")  # what a trace shows


def trace_view(host: Host):
    """The trace's run: by the name of each part it shows (TRACED), its new value, and its outcome
    (refused: the outcome, and None for each part, which would pass for the new request's)."""
    def run(clean: str, corrupted: str = "", noise_span: str = "", answer: str = "",
            request: gr.Request | None = None, progress=None) -> dict:
        lang = language(request)
        told = None
        if progress is not None:
            # The host reports from a thread of its own, where Gradio's context for this event
            # (which a gr.Progress reads) is not set: each report runs in a copy of this thread's.
            context = contextvars.copy_context()

            def told(done: int, total: int) -> None:
                context.run(progress, (done, total), unit=PLOT_TEXT[lang]["trace_unit"])
        try:
            trace = host.trace(clean, corrupted, answer, noise_span, progress=told)
        except ValueError as error:  # said in the trace's status line
            return {**dict.fromkeys(TRACED), "outcome": Outcome.refused(error)}
        line = TRACE_LINE[lang].format(answer=markdown_text(trace.answer), p_clean=trace.p_clean,
                                       p_corrupted=trace.p_corrupted)
        return {**{kind: trace_figure(trace, kind, lang) for kind in TRACE_GRIDS}, "probabilities": line,
                "outcome": None}
    return run


def measurement(image: str, caption: str) -> None:
    path = IMAGES / image
    gr.Markdown(i18n(caption))  # above the figure: as the image's label it covered the plot's title
    if path.is_file():
        swipe_hint()
        # On a phone at its drawn size, scrolling sideways (ARCHITECTURE_CSS): shrunk to the screen its
        # text could not be read.
        gr.Image(str(path), label=i18n(caption), show_label=False, interactive=False, buttons=["fullscreen"],
                 elem_classes="measurement")
    else:
        gr.Markdown(i18n("not_measured"))


class DescribedPlotData(PlotData):
    chart: str  # Gradio's front end names the figure by it in the image's alt text


class DescribedPlot(gr.Plot):
    """gr.Plot whose figure a screen reader can name: Gradio's front end writes a matplotlib
    figure's alt text as "{chart} plot visualising provided data", with no chart for matplotlib
    ("undefined plot ..."). Shown as gr.Plot is (a template of it); its settings are gr.Plot's,
    since Gradio sends the page the arguments its __init__ names."""
    is_template = True
    description = "figure"  # set on each one made

    def postprocess(self, value) -> DescribedPlotData | None:
        data = super().postprocess(value)
        return None if data is None else DescribedPlotData(type=data.type, plot=data.plot, chart=self.description)


def captioned_plot(caption: str, elem_id: str, wide: bool = False) -> gr.Plot:
    """A plot under its caption: as the plot's label the caption covered the figure's title.
    `wide`: it keeps its drawn size on a phone, and scrolls sideways there."""
    gr.Markdown(i18n(caption))
    if wide:
        swipe_hint()
    plot = DescribedPlot(show_label=False, elem_id=elem_id)
    plot.description = ENGLISH[caption].split(":")[0]
    return plot


def lens_choices(loaded, lang: str, reset: bool = True) -> dict:
    """The logit lens's adapter menu for the model being served: none, or one of its adapters;
    back at none where `reset` (another model), else as the person left it (another language)."""
    choices = [(said(NO_ADAPTER, lang), NO_ADAPTER), *loaded.adapters]
    return gr.update(choices=choices, value=NO_ADAPTER) if reset else gr.update(choices=choices)


def architecture_tab(page: Page, host: Host) -> tuple[gr.Dropdown, list[gr.Button]]:
    """Build the tab; call inside gr.Tabs(). Returns the lens's adapter menu, which follows the
    model being served (lens_choices), and the tab's buttons."""
    config = host.current.config
    with gr.Tab(i18n("tab_architecture"), id="architecture", elem_id="tab-architecture") as tab:
        gr.Markdown(i18n("architecture_intro"))
        with gr.Row():
            # Wrapped, so that a phone shows each line whole.
            gr.Code(PRE_LN, language="python", label=i18n("pre_ln"), interactive=False, wrap_lines=True)
            gr.Code(POST_LN, language="python", label=i18n("post_ln"), interactive=False, wrap_lines=True)
        gr.Markdown(i18n("seed_corrections"))

        gr.Markdown(i18n("measurements"))
        measurement("gradnorm.png", "gradnorm_caption")
        measurement("train.png", "train_caption")

        gr.Markdown(i18n("live_view"))
        with gr.Row():
            prompt = gr.Textbox(EXAMPLE_PROMPT, label=i18n("prompt"), lines=2, scale=3, elem_id="architecture-prompt")
            with gr.Column(scale=1):
                layer = PickSlider(1, slider_top(config.n_layer), value=config.n_layer, step=1, label=i18n("layer"),
                                  elem_id="architecture-layer")
                head = PickSlider(1, slider_top(config.n_head), value=1, step=1, label=i18n("head"), elem_id="architecture-head")
                run_button = gr.Button(i18n("look_inside"), variant="primary", elem_id="architecture-run")
        status = gr.Markdown(elem_id="architecture-status")
        with gr.Row():
            with gr.Column():
                norms = captioned_plot("residual_norms", "architecture-norms")
            with gr.Column():
                attention = captioned_plot("attention_map", "architecture-attention")
        top = gr.Dataframe(headers=TOP_HEADERS["en"], label=i18n("top_tokens"), interactive=False,
                           elem_id="architecture-top")
        lens_adapter = gr.Dropdown([NO_ADAPTER, *host.current.adapters], value=NO_ADAPTER, label=i18n("lens_adapter"),
                                   info=i18n("lens_adapter_info"), elem_id="architecture-lens-adapter")

        def lens_in_language(request: gr.Request) -> dict:
            return lens_choices(host.current, language(request), reset=False)
        page.on_language(lens_in_language, lens_adapter)
        lens = captioned_plot("logit_lens", "architecture-lens", wide=True)
        look = look_inside(host)
        outcome = gr.State(None)  # the last look's: None, or why it was refused
        parts = {"norms": norms, "attention": attention, "top": top, "layer": layer, "head": head, "lens": lens,
                 "outcome": outcome}
        outputs = {*parts.values(), status}

        def run(prompt_text: str, layer_value, head_value, adapter, request: gr.Request) -> dict:
            seen = look(prompt_text, layer_value, head_value, adapter, request)
            return {**{parts[name]: value for name, value in seen.items()},
                    status: status_line(seen["outcome"], language(request))}
        # One at a time: matplotlib's text layout (its mathtext parser) is not safe across threads,
        # and Gradio draws each returned figure in the event's own worker.
        one_at_a_time = dict(api_visibility="private", concurrency_limit=1, concurrency_id="look_inside")
        for event in (run_button.click, prompt.submit, layer.release, head.release, lens_adapter.input):
            event(run, [prompt, layer, head, lens_adapter], outputs, **one_at_a_time)
        # The first time a page opens the tab it looks inside at once (the prompt is filled in), so
        # the view starts drawn; later visits keep what is there.
        drawn = gr.State(False)

        def first_look(seen: bool, prompt_text: str, layer_value, head_value, adapter, request: gr.Request):
            if seen:
                return gr.skip()
            return {**run(prompt_text, layer_value, head_value, adapter, request), drawn: True}
        tab.select(first_look, [drawn, prompt, layer, head, lens_adapter], {*outputs, drawn}, **one_at_a_time)

        gr.Markdown(i18n("trace_intro"))
        # Two boxes a row on a wide screen, one on a phone (min_width), where two were too narrow to read.
        with gr.Row():
            clean = gr.Textbox(TRACE_EXAMPLE, label=i18n("clean_prompt"), lines=2, min_width=300, elem_id="trace-clean")
            corrupted = gr.Textbox(label=i18n("corrupted_prompt"), info=i18n("corrupted_prompt_info"), lines=2,
                                   min_width=300, elem_id="trace-corrupted")
        with gr.Row(equal_height=True):
            noise_span = gr.Textbox(TRACE_EXAMPLE_SPAN, label=i18n("noise_span"), info=i18n("noise_span_info"),
                                    min_width=300, elem_id="trace-noise-span")
            answer = gr.Textbox(label=i18n("answer"), info=i18n("answer_info"), min_width=300, elem_id="trace-answer")
        trace_button = gr.Button(i18n("trace"), variant="primary", elem_id="trace-run")
        trace_status = gr.Markdown(elem_id="trace-status")
        probabilities = gr.Markdown(elem_id="trace-probabilities")
        with gr.Row():  # side by side on a wide screen, one under another on a phone
            heatmaps = {}
            for kind in TRACE_GRIDS:
                with gr.Column(min_width=300):
                    heatmaps[kind] = captioned_plot(f"trace_{kind}", f"trace-{kind}")
        traced = {**heatmaps, "probabilities": probabilities}
        trace_run = trace_view(host)

        def run_trace(clean_text: str, corrupted_text: str, span: str, answer_text: str, request: gr.Request,
                      progress=gr.Progress()) -> dict:
            shown = trace_run(clean_text, corrupted_text, span, answer_text, request, progress)
            return {**{traced[name]: shown[name] for name in TRACED},
                    trace_status: status_line(shown["outcome"], language(request))}
        # One at a time with the live view: both draw figures (one_at_a_time says why).
        for event in (trace_button.click, clean.submit, corrupted.submit, noise_span.submit, answer.submit):
            event(run_trace, [clean, corrupted, noise_span, answer], {*traced.values(), trace_status},
                  **one_at_a_time)
    return lens_adapter, [run_button, trace_button]

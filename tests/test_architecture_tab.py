"""The Architecture tab's live view: its handler on a real model, and the tab in a real browser."""
from __future__ import annotations

import re

import pytest
import torch
from matplotlib.figure import Figure
from playwright.sync_api import expect

from serve.outcome import status_line
from ui.tabs.architecture import in_a_cell, look_inside
from serve.model_host import ModelHost

from .conftest import TIMEOUT_MS, make_hf_checkpoint, screenshot

pytestmark = pytest.mark.slow  # the app served, its Architecture tab


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return ModelHost([str(tiny_checkpoint)], device="cpu")


def test_look_inside_draws_both_plots_and_lists_ten_tokens(host):
    seen = look_inside(host)("The little bird sang", 2, 2)
    norms, attention, top, layer, head, lens = (seen[name] for name in ("norms", "attention", "top", "layer", "head",
                                                                       "lens"))
    assert seen["outcome"] is None
    assert isinstance(lens, Figure) and len(lens.axes[0].texts) == 2 * 4  # a top token per layer and position
    assert isinstance(norms, Figure) and isinstance(attention, Figure)
    assert [line.get_label() for line in norms.axes[0].lines] == ["mean over tokens", "last token"]
    assert len(norms.axes[0].lines[0].get_xdata()) == 2 + 2  # embeddings, 2 layers, ln_f
    assert [t.get_text() for t in attention.axes[0].get_xticklabels()] == ["The", "␣little", "␣bird", "␣sang"]
    assert list(top.columns) == ["token", "probability"]
    percents = [float(p.rstrip("%")) for p in top["probability"]]
    assert len(top) == 10 and all(0 < p <= 100 for p in percents)
    assert percents == sorted(percents, reverse=True)
    assert layer["maximum"] == 2 and head["maximum"] == 2

    # Sliders left at a larger model's layer: the request still runs, on this model's last layer.
    seen = look_inside(host)("The little bird sang", 12, 12)
    assert seen["layer"]["value"] == 2 and seen["head"]["value"] == 2
    seen = look_inside(host)("The little bird sang", float("inf"), 2)  # held to the last layer too
    assert seen["layer"]["value"] == 2
    seen = look_inside(host)("The little bird sang", -3, 0)  # and below the first to the first
    assert seen["layer"]["value"] == 1 and seen["head"]["value"] == 1 and seen["outcome"] is None
    from ui.pick_slider import PickSlider  # the sliders hand a typed value on as it is, for look_inside to hold
    assert PickSlider(1, 2, step=1).preprocess(99) == 99 and PickSlider(1, 2, step=1).preprocess(-3) == -3


def test_japanese_tokens_are_drawn_in_a_font_that_has_them(host):
    """Whole-character tokens of Chinese, Japanese or Korean are drawn in a CJK font (.ci/run and a
    Space's packages.txt install one), not as the empty boxes of matplotlib's own font."""
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ui.tabs.architecture import plot_fonts

    assert plot_fonts()[0] == "DejaVu Sans" and len(plot_fonts()) > 1  # and a CJK font after it
    seen = look_inside(host)("日本語のテキスト", 2, 1)
    figures, lens = [seen["norms"], seen["attention"]], seen["lens"]
    assert seen["outcome"] is None and "テ" in [t.get_text() for t in lens.axes[0].get_xticklabels()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for figure in (*figures[:2], lens):
            FigureCanvasAgg(figure).draw()
    assert not [str(w.message) for w in caught if "missing from font" in str(w.message)]


def test_a_chinese_page_gets_its_plots_text_in_chinese():
    """Titles, axes and legends are drawn into the image, where the browser cannot translate
    them: a page asking for Chinese gets them in Chinese, in a font that has the glyphs."""
    import re
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg


    class ChineseRequest:
        headers = {"accept-language": "zh-CN,zh;q=0.9"}

    host = ModelHost(["bundled"], device="cpu")  # the lens with an adapter has its own title line
    seen = look_inside(host)("The little bird sang", 2, 1, "translate", ChineseRequest())
    assert seen["outcome"] is None and list(seen["top"].columns) == ["词元", "概率"]
    figures = [seen["norms"], seen["attention"], seen["lens"]]
    texts = [text for figure in figures for ax in figure.axes
             for text in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel(),
                          *(t.get_text() for t in (ax.get_legend().get_texts() if ax.get_legend() else [])))
             if text and text != "||h||"]
    assert len(texts) >= 12, texts  # three titles, their axes, the legend's three lines, the colour bar
    untranslated = [text for text in texts if not re.search(r"[\u4e00-\u9fff]", text)]
    assert not untranslated, untranslated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for figure in figures:
            FigureCanvasAgg(figure).draw()
    assert not [str(w.message) for w in caught if "missing from font" in str(w.message)]


def test_a_lens_label_too_long_for_its_cell_says_it_was_cut():
    assert in_a_cell("␣directly") == "␣direct…" and in_a_cell("␣direct") == "␣direct"
    assert in_a_cell("ab\\xf0\\x9f") == "ab\\xf0…"  # not inside the second byte's escape


@pytest.mark.parametrize("adapter", [None, "summarize"])
def test_the_lens_title_fits_its_figure_for_a_one_token_prompt(adapter):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from model.checkpoint import load_pretrained
    from serve.inspection import logit_lens
    from ui.tabs.architecture import lens_figure
    model, tokenizer = load_pretrained(None)  # the bundled model: it has the adapter
    lens = lens_figure(logit_lens(model, tokenizer, "Hi", adapter), adapter)
    renderer = FigureCanvasAgg(lens).get_renderer()
    title, frame = lens.axes[0].title.get_window_extent(renderer), lens.bbox
    assert frame.x0 <= title.x0 and title.x1 <= frame.x1, (title, frame)


@pytest.mark.parametrize("prompt, layer, head, message", [
    ("x" * 20_001, 1, 1, "prompt is too long: 20,001 characters; the limit is 20,000"),
    ("The bird", float("nan"), 1, "layer must be between 1 and 2, got nan"),
    ("The bird", 1, None, "head must be an integer, got None"),
])
def test_look_inside_refuses_bad_input_with_a_clear_message(host, prompt, layer, head, message):
    seen = look_inside(host)(prompt, layer, head)
    # The plots go (left under another prompt they passed for its); the sliders stay.
    assert seen == {"norms": None, "attention": None, "top": None, "lens": None, "outcome": seen["outcome"]}
    assert status_line(seen["outcome"], "en") == f"⚠️ {message}"  # in the tab's status line


@pytest.mark.browser
def test_the_live_view_shows_the_plots_and_the_top_tokens(page):
    page.get_by_role("tab", name="Architecture").click()
    expect(page.locator("#architecture-lens img")).to_be_visible(timeout=TIMEOUT_MS)  # drawn on opening the tab
    page.locator("#architecture-prompt textarea").fill("")
    page.locator("#architecture-run").click()
    expect(page.locator("#architecture-status")).to_contain_text("the prompt is empty")
    assert page.get_by_test_id("toast-body").count() == 0  # a refusal is the status line's alone
    expect(page.locator("#architecture-lens img")).to_have_count(0)  # the last prompt's plots have gone
    expect(page.locator("#architecture-norms img")).to_have_count(0)
    assert page.locator("#tab-architecture .error").count() == 0
    screenshot(page, "architecture-refused")
    expect(page.get_by_text("h = ln_f(h)")).to_be_visible()
    page.locator("#architecture-prompt textarea").fill("The little bird sang a song")
    page.locator("#architecture-run").click()
    # Ten rows and the header; a busy CPU takes a while to draw the figures.
    expect(page.locator("#architecture-top [role=grid]")).to_have_attribute("aria-rowcount", "11", timeout=TIMEOUT_MS)
    expect(page.locator("#architecture-norms img")).to_be_visible()
    expect(page.locator("#architecture-attention img")).to_be_visible()
    expect(page.locator("#architecture-lens img")).to_be_visible()
    # Each figure is named for a screen reader (Gradio's own alt text read "undefined plot ...").
    for part, name in (("norms", "Residual stream norm"), ("attention", "Attention map"), ("lens", "Logit lens")):
        expect(page.locator(f"#architecture-{part} img")).to_have_attribute("alt", re.compile(f"^{name}"))
    screenshot(page, "architecture-live-view")
    page.locator("#architecture-lens-adapter input").click()
    page.get_by_role("option", name="summarize").click()  # the lens with the adapter: changed cells outlined
    expect(page.locator("#architecture-lens img")).to_be_visible()
    page.wait_for_timeout(1500)
    assert page.locator("#tab-architecture .error").count() == 0  # no component in Gradio's error state
    screenshot(page, "architecture-logit-lens")
    # A head typed past the last is held to the last, as a model switch's would be; neither is one of
    # Gradio's error toasts.
    head = page.locator("#architecture-head input[type=number]")
    last = head.get_attribute("max")
    assert last != "1"  # so that the last head's map is another picture than head 1's
    first_head = page.locator("#architecture-attention img").get_attribute("src")
    head.fill("99")
    # Leaving the box runs the view with the typed value (the slider's release), held to the last;
    # a Run clicked before that run has answered races it with the head as it was (noted in
    # docs/app.md), so the click waits for it here.
    head.press("Tab")
    expect(head).to_have_value(last)
    # the last head's map drawn (a busy CPU may take seconds), and no toast
    expect(page.locator("#architecture-attention img")).not_to_have_attribute("src", first_head)
    assert page.get_by_test_id("toast-body").count() == 0
    # Run keeps the held head; its answer is in when the new prompt's top tokens are (an answer
    # still on its way would set the head box after the next step's typing)
    top = page.locator("#architecture-top")
    top_before = top.inner_text()
    page.locator("#architecture-prompt textarea").fill("The old man walked home")
    page.locator("#architecture-run").click()
    expect(top).not_to_have_text(top_before)
    expect(head).to_have_value(last)
    # One below the first: Gradio's slider puts its box back to the first as it loses focus, and
    # the run draws head 1, as the box says.
    drawn = page.locator("#architecture-attention img").get_attribute("src")
    head.fill("-3")
    head.press("Tab")  # its own run first, as above
    expect(head).to_have_value("1")
    page.locator("#architecture-run").click()
    expect(head).to_have_value("1")
    expect(page.locator("#architecture-attention img")).not_to_have_attribute("src", drawn)  # drawn, not refused
    expect(page.locator("#architecture-status")).to_have_text("")
    assert page.get_by_test_id("toast-body").count() == 0


def test_a_model_of_one_layer_and_one_head_gets_sliders_and_a_view(tmp_path):
    import app

    checkpoint = make_hf_checkpoint(tmp_path / "one-layer", n_positions=64, n_embd=32, n_layer=1, n_head=1)
    host = ModelHost([str(checkpoint)], device="cpu")
    app.build_app(host)  # Gradio refuses a slider from 1 to 1
    seen = look_inside(host)("The little bird sang", 2, 2)
    assert seen["layer"]["value"] == 1 and seen["head"]["value"] == 1


@pytest.mark.parametrize("width", [1400, 390], ids=["desktop", "phone"])
def test_the_logit_lens_stays_readable_on_a_phone(browser, studio_url, width):
    """On a narrow screen the lens keeps the size it was drawn at and scrolls sideways (shrunk to
    the screen its text could not be read); on a wide one it fits. The plots' captions sit above
    them, not over their titles."""
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    try:
        page.goto(studio_url)
        page.get_by_role("tab", name="Architecture").click()
        lens = page.locator("#architecture-lens img")
        expect(lens).to_be_visible(timeout=TIMEOUT_MS)
        natural, shown, box, scrolls = lens.evaluate(
            "i => [i.naturalWidth, i.clientWidth, i.parentElement.clientWidth, i.parentElement.scrollWidth]")
        if width <= 768:  # the CSS's max-width
            assert natural > box and shown == natural and scrolls == natural
        else:
            assert shown <= box and scrolls == box
        for plot, caption in (("norms", "Residual stream norm"), ("attention", "Attention map")):
            assert page.locator(f"#architecture-{plot} label").is_hidden()
            above = page.get_by_text(caption, exact=True).bounding_box()
            assert above["y"] + above["height"] <= page.locator(f"#architecture-{plot}").bounding_box()["y"]
        screenshot(page, f"architecture-{width}")
    finally:
        page.context.close()


def test_a_long_prompt_wraps_the_lens_onto_even_rows_no_wider_than_one():
    from serve.inspection import LogitLens
    from ui.tabs.architecture import LENS_COLUMNS, lens_figure

    def grids(positions: int):
        tokens = [f"t{i}" for i in range(positions)]
        figure = lens_figure(LogitLens(tokens, [tokens] * 3, torch.full((3, positions), 0.5),
                                       torch.zeros(3, positions, dtype=bool)), "summarize")
        return figure, [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]

    def starts(axes) -> list[str]:
        return [ax.get_xticklabels()[0].get_text() for ax in axes]

    (full, one_row), (wrapped, three_rows) = grids(LENS_COLUMNS), grids(2 * LENS_COLUMNS + 3)
    assert len(one_row) == 1 and len(three_rows) == 3
    assert starts(three_rows) == ["t0", "t15", "t30"]  # 43 tokens: rows of 15, 15 and 13
    assert wrapped.get_figwidth() < full.get_figwidth()
    assert three_rows[-1].get_xlim() == three_rows[0].get_xlim()  # the short last row keeps the cells' width
    two, two_rows = grids(LENS_COLUMNS + 1)
    assert starts(two_rows) == ["t0", "t11"]  # not 20 and a lone token
    heights = [figure.get_figheight() for figure in (full, two, wrapped)]
    assert heights[1] - heights[0] == pytest.approx(heights[2] - heights[1]) and heights[1] - heights[0] > 1  # a row's


# --- the trace (activation patching) ---------------------------------------------------------------

def test_a_trace_figure_has_the_tokens_as_rows_the_layers_as_columns_and_a_range_about_zero():
    from ui.tabs.architecture import TRACE_GRIDS, trace_figure
    from serve.tracing import Trace

    grid = torch.tensor([[0.0, 0.2, 0.0], [1.3, -0.4, 0.1]])
    trace = Trace(tokens=["The", "␣bird"], layers=3, grid=grid, attention=grid / 2, mlp=-grid, p_clean=0.5,
                  p_corrupted=0.1, answer="␣sang", noised=[1])
    for kind in TRACE_GRIDS:
        figure = trace_figure(trace, kind)
        ax, bar = figure.axes  # the heatmap and its colour bar
        assert [t.get_text() for t in ax.get_yticklabels()] == ["The", "␣bird *"]  # the noised token starred
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
        assert ax.get_xlabel() == "layer" and "p(␣sang)" in ax.get_title()
        low, high = ax.images[0].get_clim()
        assert low == -high and high == pytest.approx(1.3 if kind != "attention" else 1.0)  # -1..1 and beyond
        assert bar.get_ylabel() == "normalised effect"


def test_a_trace_refuses_a_corrupted_prompt_of_another_length_naming_both_counts(host):
    from ui.tabs.architecture import trace_view
    shown = trace_view(host)("The little bird sang", "A bird", "", "")
    assert shown == {"residual": None, "attention": None, "mlp": None, "probabilities": None,
                     "outcome": shown["outcome"]}
    assert status_line(shown["outcome"], "en") == ("⚠️ the corrupted prompt has 2 tokens and the clean prompt 4: "
                                                   "a trace needs as many in both")


@pytest.mark.browser
@pytest.mark.parametrize("width", [1400, 390], ids=["desktop", "phone"])
def test_a_trace_shows_three_heatmaps_and_the_probabilities(browser, studio_url, width):
    """The example traced (noise on a span of it): three heatmaps, readable at the page's width,
    and the line naming p_clean and p_corrupted; a corrupted prompt of another length is refused in
    the status line, naming both counts, and the heatmaps go."""
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    try:
        page.goto(studio_url)
        page.get_by_role("tab", name="Architecture").click()
        page.locator("#trace-run").click()
        heatmaps = [page.locator(f"#trace-{kind} img") for kind in ("residual", "attention", "mlp")]
        for heatmap, name in zip(heatmaps, ("Residual stream restored", "Attention output restored",
                                            "MLP output restored")):
            expect(heatmap).to_be_visible(timeout=TIMEOUT_MS)
            expect(heatmap).to_have_attribute("alt", re.compile(f"^{name}"))
            natural, shown = heatmap.evaluate("i => [i.naturalWidth, i.clientWidth]")
            assert shown >= 0.85 * natural, (natural, shown)  # not shrunk past reading
            assert heatmap.bounding_box()["x"] + shown <= width  # and on the screen
        expect(page.locator("#trace-probabilities")).to_contain_text(re.compile(r"p_clean [\d.e-]+ · p_corrupted [\d.e-]+"))
        expect(page.locator("#trace-status")).to_have_text("")
        tops = {round(heatmap.bounding_box()["y"]) for heatmap in heatmaps}
        assert len(tops) == (1 if width > 768 else 3)  # side by side, or one under another on a phone
        page.locator("#trace-residual").scroll_into_view_if_needed()
        screenshot(page, f"architecture-trace-{width}")
        if width > 768:
            page.locator("#trace-corrupted textarea").fill("A bird")
            page.locator("#trace-run").click()
            expect(page.locator("#trace-status")).to_contain_text(
                re.compile(r"the corrupted prompt has \d+ tokens and the clean prompt \d+: a trace needs as many"))
            for heatmap in heatmaps:
                expect(heatmap).to_have_count(0)
            expect(page.locator("#trace-probabilities")).to_have_text("")
            assert page.get_by_test_id("toast-body").count() == 0
            screenshot(page, "architecture-trace-refused")
    finally:
        page.context.close()

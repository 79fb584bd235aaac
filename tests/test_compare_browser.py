"""Compare in a real browser (Debian's Chromium, as tests/test_app_browser.py drives it): a model
comparison across two tokenizers and a setting comparison, on a desktop's width and a phone's, in
English and in Chinese; and a compared Chat turn whose kept side goes on in the conversation.
Screenshots go to test-output/ for a person to look at."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from .conftest import TIMEOUT_MS, screenshot, serve_studio
from .test_app_browser import COMPARE_OFF, chat_turns, choose, set_setting, status, wait_for_run

pytestmark = pytest.mark.browser

WIDTHS = {"desktop": (1400, 1000), "phone": (390, 844)}


@pytest.fixture(scope="module")
def compare_url(app_models):
    """The app with the test model that has adapters, and the bundled model: another tokenizer."""
    with serve_studio([app_models[0], "bundled"]) as url:
        yield url


def opened(browser, url: str, width: str, locale: str = "en-US") -> Page:
    w, h = WIDTHS[width]
    page = browser.new_context(locale=locale, viewport={"width": w, "height": h}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#generate-run")
    return page


def comparing(page: Page, task: str, kind: str) -> None:
    """Open the tab's Why this output and pick what differs."""
    page.locator(f"#{task}-insight").get_by_text("Why this output").click()
    choose(page, f"#{task}-compare", kind)


def sides(page: Page, task: str):
    return [page.locator(f"#{task}-compare-{side}") for side in ("first", "second")]


def fits_the_width(page: Page) -> None:
    """Nothing on the page is wider than the window: no sideways scrolling."""
    assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_model_comparison_shows_both_models_side_by_side_parting_by_text(browser, compare_url, app_models, width):
    """Another model, of another tokenizer: both texts under their models' names, each with its
    status line (its speed), the tokens of both in the token view with the first token where they
    part marked on each, found by the text; the output box holds the served model's side."""
    page = opened(browser, compare_url, width)
    try:
        page.locator("#generate-prompt textarea").fill("Once upon a time")
        set_setting(page, "generate", "seed", 7)
        set_setting(page, "generate", "max_new_tokens", 16)
        comparing(page, "generate", "Another model")
        expect(page.locator("#generate-compare-model input")).to_have_value("bundled")  # the other model
        page.locator("#generate-run").click()
        line = wait_for_run(page, "generate", 7)
        assert f"model {app_models[0]} vs model bundled: the output and counts are with model {app_models[0]}" in line
        first, second = sides(page, "generate")
        expect(first).to_contain_text(f"model {app_models[0]}")
        expect(second).to_contain_text("model bundled")
        texts = [side.locator("textarea").input_value() for side in (first, second)]
        assert all(texts) and texts[0] != texts[1]
        expect(page.locator("#generate-output textarea")).to_have_value(texts[0])
        for side in ("first", "second"):
            expect(page.locator(f"#generate-compare-{side}-status")).to_contain_text(re.compile(r"\d tokens/s"))
        view = page.locator("#generate-tokens")
        expect(view.locator(".token-row")).to_have_count(2)
        expect(view.locator(".tok.diverges")).to_have_count(2)
        expect(view).to_contain_text("the texts differ from character")
        page.locator("#generate-tokens").scroll_into_view_if_needed()
        fits_the_width(page)
        screenshot(page, f"compare-model-{width}")
    finally:
        page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_setting_comparison_is_one_setting_apart_under_one_seed(browser, compare_url, width):
    """temperature 0.7 against 1: the line names both, the output box holds the side of the settings
    as set, each side's status line names its own settings."""
    page = opened(browser, compare_url, width)
    try:
        page.locator("#generate-prompt textarea").fill("The little bird")
        set_setting(page, "generate", "seed", 12)
        set_setting(page, "generate", "max_new_tokens", 20)
        set_setting(page, "generate", "temperature", 0.7)
        comparing(page, "generate", "One decoding setting")
        expect(page.locator("#generate-compare-setting input")).to_have_value("Temperature")
        value = page.locator("#generate-compare-value input")
        value.fill("1")
        value.press("Tab")
        page.locator("#generate-run").click()
        line = wait_for_run(page, "generate", 12)
        assert "temperature 0.7 vs temperature 1: the output and counts are with temperature 0.7" in line, line
        first, second = sides(page, "generate")
        expect(first).to_contain_text("temperature 0.7")
        expect(second).to_contain_text("temperature 1")
        expect(page.locator("#generate-output textarea")).to_have_value(first.locator("textarea").input_value())
        expect(page.locator("#generate-compare-first-status")).to_contain_text("changed settings: temperature 0.7")
        expect(page.locator("#generate-compare-second-status")).not_to_contain_text("changed settings: temperature")
        expect(page.locator("#generate-tokens .token-row")).to_have_count(2)
        page.locator("#generate-compare-first").scroll_into_view_if_needed()
        fits_the_width(page)
        screenshot(page, f"compare-setting-{width}")
        # a value the setting does not take is refused, naming compare and the range
        value.fill("9")
        value.press("Tab")
        page.locator("#generate-run").click()
        expect(page.locator("#generate-status")).to_contain_text("compare: temperature must be between 0.0 and 5.0, got 9")
    finally:
        page.context.close()


def test_compare_speaks_chinese(browser, compare_url):
    page = opened(browser, compare_url, "phone", locale="zh-CN")
    try:
        page.locator("#generate-prompt textarea").fill("Once upon a time")
        page.locator("#generate-insight").get_by_text("为什么是这个输出").click()
        choose(page, "#generate-compare", "一项解码设置")
        expect(page.locator("#generate-compare")).to_contain_text("并排对比")
        expect(page.locator("#generate-compare-value")).to_contain_text("它在第二侧的值")
        value = page.locator("#generate-compare-value input")
        value.fill("0.5")
        value.press("Tab")
        page.locator("#generate-run").click()
        expect(page.locator("#generate-status")).to_contain_text("对比：输出和计数属于温度 1一侧")
        expect(page.locator("#generate-compare-second")).to_contain_text("温度 0.5")
        page.locator("#generate-compare-first").scroll_into_view_if_needed()
        screenshot(page, "compare-setting-zh")
    finally:
        page.context.close()


def test_a_compared_chat_turn_keeps_both_replies_and_goes_on_with_the_one_picked(browser, compare_url):
    """Both sides of a compared turn are replies to it (◀ ▶), the shown one first in view; the one
    picked is the one the next turn's prompt holds."""
    page = opened(browser, compare_url, "desktop")
    try:
        page.get_by_role("tab", name="Chat").click()
        set_setting(page, "dialogue", "seed", 3)
        comparing(page, "dialogue", "One decoding setting")
        choose(page, "#dialogue-compare-setting", "Max new tokens")
        value = page.locator("#dialogue-compare-value input")
        value.fill("3")
        value.press("Tab")
        page.locator("#dialogue-message textarea").fill("Hello there!")
        page.locator("#dialogue-run").click()
        wait_for_run(page, "dialogue", 3)
        first, second = (side.locator("textarea").input_value() for side in sides(page, "dialogue"))
        assert first != second
        which = page.locator("#dialogue-which-reply")
        expect(which).to_contain_text("2 / 2")
        assert chat_turns(page)[1][-1].strip() == first.strip()
        page.locator("#dialogue-previous-reply").click()
        expect(which).to_contain_text("1 / 2")
        expect(page.locator("#dialogue-chatbot [data-testid=bot]").last).to_have_text(second.strip())
        assert "the max_new_tokens 3 side of a comparison" in status(page, "dialogue")
        screenshot(page, "compare-chat")
        choose(page, "#dialogue-compare", COMPARE_OFF)
        page.locator("#dialogue-message textarea").fill("And then?")
        page.locator("#dialogue-run").click()
        wait_for_run(page, "dialogue", 3)
        page.locator("#tab-dialogue").get_by_text("Prompt sent to the model").click()
        sent = page.locator("#dialogue-prompt-sent textarea").input_value()
        assert f"Hello there!\nBot: {second.strip()}" in sent and first.strip() not in sent, sent
    finally:
        page.context.close()

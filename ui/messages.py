"""What the page says depends on the request: its language, from the browser's Accept-Language,
or the language picked in the page's Settings (PAGE_LANGUAGE_JS). The messages themselves, in
English and Chinese, are serve/messages.py's."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

WORDS_ZH = {"error": "错误", "warning": "警告"}

LANGUAGE_KEY = "pre-ln-gpt2-studio-language"  # the browser's storage of the language picked in Settings
# What the page keeps in the browser (gr.BrowserState: Chat's conversations, each tab's presets) is
# encrypted with this; a fixed one, so that it survives a restart of the app (a random one per
# start would make it unreadable).
BROWSER_SECRET = "pre-ln-gpt2-studio"
LANGUAGE_SWITCHED = "page-language-switched"  # the hidden button the page presses when it is picked

# Gradio's Settings can switch the page to another language than the browser's. Gradio then
# translates its labels in the browser and sets the page's lang, but three things stayed behind,
# which this script, run as the page opens, sees to:
# - the server's requests still carried the browser's Accept-Language, so what the server writes
#   (status lines, refusals, plots) was in the browser's language: each request to the app is
#   sent with the page's language instead;
# - what the server wrote as the page opened (the model line, the examples' labels, the tabs'
#   names) stayed as it was: the page presses a hidden button (LANGUAGE_SWITCHED), which writes
#   them again (Page.on_language);
# - Gradio starts in the browser's language and keeps no choice across a reload: the choice is
#   kept in the browser, asked of the server from the page's first request, and set again in
#   Gradio as the page opens, through the function Settings calls (changeLocale, in the module of
#   Gradio's front end that the page loaded as core-*.js).
PAGE_LANGUAGE_JS = f"""() => {{
  // A language kept from an earlier visit is asked for from the first request on, so that what
  // the server writes as the page opens is in it; Gradio is switched to it below.
  const picked = localStorage.getItem("{LANGUAGE_KEY}");
  let sent = picked || document.documentElement.lang;
  const send = window.fetch.bind(window);
  window.fetch = (input, init = {{}}) => {{
    const url = new URL(input instanceof Request ? input.url : String(input), location.href);
    if (!sent || url.origin !== location.origin) return send(input, init);
    const headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
    headers.set("Accept-Language", sent);
    return send(input, {{...init, headers}});
  }};
  new MutationObserver(() => {{
    const lang = document.documentElement.lang;
    if (!lang || lang === sent) return;
    sent = lang;
    localStorage.setItem("{LANGUAGE_KEY}", lang);
    document.getElementById("{LANGUAGE_SWITCHED}")?.click();
  }}).observe(document.documentElement, {{attributes: true, attributeFilter: ["lang"]}});
  const core = performance.getEntriesByType("resource").map(entry => entry.name)
    .find(name => /\\/assets\\/core-[^/]*\\.js$/.test(name));
  if (picked && picked !== document.documentElement.lang && core) import(core).then(module => module.changeLocale(picked));
}}"""


# The page's own events (and JavaScript alone): not queued behind the runs, and not in the API.
PAGE_EVENT = dict(queue=False, api_visibility="private")


@dataclass(frozen=True)
class Page:
    """The page's own events that its parts join: its load, and its language switched in Settings
    (the LANGUAGE_SWITCHED button, laid out first)."""
    blocks: gr.Blocks
    language_switched: gr.Button

    def on_language(self, fn, outputs, inputs=None) -> None:
        """Run `fn` (given `inputs`' values and the request, whose language() it may write in) as the
        page opens, and again whenever the page's language is switched in Settings."""
        gr.on([self.blocks.load, self.language_switched.click], fn, inputs, outputs, **PAGE_EVENT)


def language(request: gr.Request | None) -> str:
    """"zh" where the browser asks for Chinese first, else "en" (the API's and the log's)."""
    header = "" if request is None else (request.headers.get("accept-language") or "")
    first = header.split(",")[0].strip().lower()
    return "zh" if first.startswith("zh") else "en"


# How long a notice stays: long enough to read a line, short enough not to sit over the boxes
# below it (Gradio's 10 s hid Chat's persona on a phone after a refused import).
NOTICE_S = 5


def warn(message: str, lang: str) -> None:
    """A notice beside a refusal the status line also says, where that line may be out of view."""
    gr.Warning(message, title=word("warning", lang), duration=NOTICE_S)


def word(key: str, lang: str) -> str:
    """A toast's title ("error", "warning") in `lang`."""
    return WORDS_ZH[key] if lang == "zh" else key.capitalize()

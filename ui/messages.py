"""What the page says depends on the request: its language, from the browser's Accept-Language,
or the language picked in the page's Settings (PAGE_LANGUAGE_JS). The messages themselves, in
English and Chinese, are serve/messages.py's."""
from __future__ import annotations

import gradio as gr

WORDS_ZH = {"error": "错误", "warning": "警告"}

# Gradio's Settings can switch the page to another language than the browser's: it translates its
# labels in the browser, and sets the page's lang, but the server's requests still carry the
# browser's Accept-Language, so what the server writes (status lines, refusals, plots) stayed in
# the browser's language. Each request to the app is sent with the page's language instead.
PAGE_LANGUAGE_JS = """() => {
  const send = window.fetch.bind(window);
  window.fetch = (input, init = {}) => {
    const lang = document.documentElement.lang;
    const url = new URL(input instanceof Request ? input.url : String(input), location.href);
    if (!lang || url.origin !== location.origin) return send(input, init);
    const headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
    headers.set("Accept-Language", lang);
    return send(input, {...init, headers});
  };
}"""


def language(request: gr.Request | None) -> str:
    """"zh" where the browser asks for Chinese first, else "en" (the API's and the log's)."""
    header = "" if request is None else (request.headers.get("accept-language") or "")
    first = header.split(",")[0].strip().lower()
    return "zh" if first.startswith("zh") else "en"


def word(key: str, lang: str) -> str:
    """A toast's title ("error", "warning") in `lang`."""
    return WORDS_ZH[key] if lang == "zh" else key.capitalize()

"""What the page says depends on the request: its language, from the browser's Accept-Language.
The messages themselves, in English and Chinese, are serve/messages.py's."""
from __future__ import annotations

import gradio as gr

WORDS_ZH = {"error": "错误", "warning": "警告"}


def language(request: gr.Request | None) -> str:
    """"zh" where the browser asks for Chinese first, else "en" (the API's and the log's)."""
    header = "" if request is None else (request.headers.get("accept-language") or "")
    first = header.split(",")[0].strip().lower()
    return "zh" if first.startswith("zh") else "en"


def word(key: str, lang: str) -> str:
    """A toast's title ("error", "warning") in `lang`."""
    return WORDS_ZH[key] if lang == "zh" else key.capitalize()

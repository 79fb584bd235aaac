"""Names a screen reader says for the parts of the page whose markup leaves them unnamed.

Gradio wraps a text box and its copy button in one <label>, and Chromium then names the box
nothing, so the output boxes (Continuation, Translation, Summary) were read as "edit text"; and a
button whose text is a symbol (Translate's ⇄) is named by that symbol. This script, run as the
page opens, names each box by the label shown above it (which Gradio translates), and each
symbol button by its entry in SYMBOL_BUTTONS in the page's language, again whenever Gradio draws
them anew or the language is switched.
"""
from __future__ import annotations

import json

from .i18n import CHINESE, ENGLISH

SYMBOL_BUTTONS = {"translate-swap": "swap_languages"}  # elem_id: its name's key in ui/i18n.py

NAMED_PARTS_JS = f"""() => {{
  const names = {json.dumps({elem_id: {"en": ENGLISH[key], "zh": CHINESE[key]}
                             for elem_id, key in SYMBOL_BUTTONS.items()}, ensure_ascii=False)};
  const name = () => {{
    const lang = document.documentElement.lang.startsWith("zh") ? "zh" : "en";
    for (const [id, said] of Object.entries(names)) {{
      const button = document.getElementById(id);
      if (button && button.getAttribute("aria-label") !== said[lang]) {{
        button.setAttribute("aria-label", said[lang]);
        button.title = said[lang];
      }}
    }}
    for (const box of document.querySelectorAll(".block textarea")) {{
      const label = box.closest(".block").querySelector('[data-testid="block-info"]')?.textContent.trim();
      if (label && box.getAttribute("aria-label") !== label) box.setAttribute("aria-label", label);
    }}
  }};
  let due = false;
  new MutationObserver(() => {{
    if (!due) {{ due = true; requestAnimationFrame(() => {{ due = false; name(); }}); }}
  }}).observe(document.documentElement, {{subtree: true, childList: true, characterData: true,
                                         attributes: true, attributeFilter: ["lang"]}});
  name();
}}"""

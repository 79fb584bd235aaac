"""The Chat tab: a gr.Chatbot conversation with a persona line, retry / undo / clear, and the
conversation exported as JSON and imported back.

The conversation, the persona, the adapter switch and the decoding settings, with the run of the
reply shown (its status line, and the replies kept after a retry), are kept in the browser's own
storage (gr.BrowserState: per browser, never on the server), so they survive a reload; "New chat" files the conversation under "Earlier conversations", from where it can be
reopened, and starts an empty one with the same persona, adapter and settings (as chat apps keep
their settings across conversations).

The API (/chat) takes the history as [user, bot] pairs, the shape an exported conversation has,
so a conversation saved from the browser can be sent back through the API as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from serve import PERSONAS
from serve.messages import Refusal, localized, message_of
from serve.outcome import GREEDY_SAME, SAME_SEED, Outcome
from serve.apis import CHAT_API, history_pairs
from serve.running import RANDOM_SEED, checked_text

from ..i18n import i18n
from ..messages import language, word
from ..tab import NOTHING, Tab, TaskView, Widgets, adapter_props
from ..tokens import Insight

# The conversation's height is capped on the messages' own scrolling box, not on the Chatbot's
# (its max_height): Gradio follows the newest reply by scrolling that inner box, which scrolls only
# where it is the one capped. It starts below the label and the clear / copy buttons, which
# Gradio lays over the top of the messages, where they hid the first line of a scrolled conversation.
CHAT_CSS = """
#dialogue-chatbot .bubble-wrap { max-height: 360px; margin-top: 2.75rem; }
"""
# A conversation that grows pushes the message box and Send down, out of the window after a turn
# or two (and so does a long message as it is typed). While the person is at the conversation
# (last typed, tapped or clicked in it, the message box or Send, and has not scrolled since), each
# time one of them or the status line grows, the page scrolls just enough to bring Send back, and
# the status line under it once a run has one (the reply's seed), as a chat app keeps its input in
# view. Where the focus is would not tell: Safari focuses no button it clicks, and a phone's tap
# on Send takes the focus from the box. Their sizes are watched, not the conversation's value: the
# buttons under the newest reply appear once the run has ended, after its last change. Watching
# starts when the person first comes to the conversation, when Chat's parts are surely on the page.
KEEP_MESSAGE_BOX_IN_VIEW_JS = """() => {
  const parts = "#dialogue-message, #dialogue-run, #dialogue-chatbot";
  let atConversation = false, follow = null;
  const at = (event) => {
    atConversation = Boolean(event.target.closest && event.target.closest(parts));
    if (!atConversation || follow) return;
    follow = new ResizeObserver(() => {
      const status = document.querySelector("#dialogue-status");
      const lowest = status?.offsetHeight ? status : document.querySelector("#dialogue-run");
      if (atConversation) lowest?.scrollIntoView({block: "nearest"});
    });
    for (const part of document.querySelectorAll("#dialogue-chatbot, #dialogue-message, #dialogue-status")) {
      follow.observe(part);
    }
  };
  for (const kind of ["pointerdown", "keydown", "focusin"]) document.addEventListener(kind, at, true);
  for (const kind of ["wheel", "touchmove"]) document.addEventListener(kind, () => { atConversation = false; }, true);
}"""
# Editing a message in the conversation, Enter saves the edit and Escape cancels it, as in the
# message box (Shift+Enter starts a new line): Gradio's edit box took Enter as a new line, kept in
# the message sent, and saving it needed its small ✓. Its two buttons, ✓ then ✗, are found by
# place (after the message), since their names follow the page's language.
EDIT_KEYS_JS = """() => {
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLTextAreaElement) || !box.closest("#dialogue-chatbot") || event.isComposing
        || event.keyCode === 229 || !(event.key === "Escape" || (event.key === "Enter" && !event.shiftKey))) return;
    let after = box.closest(".message-row")?.nextElementSibling;  // the edited message's buttons follow it
    while (after && !after.matches(".message-buttons-right, .message-row")) after = after.nextElementSibling;
    const button = after?.matches(".message-buttons-right") && after.querySelectorAll("button")[event.key === "Enter" ? 0 : 1];
    if (!button) return;
    event.preventDefault();
    button.click();
  });
}"""
EXPORT_DIR = Path(tempfile.gettempdir()) / "pre-ln-gpt2-studio" / "conversations"
# Every finished turn, undo or clear writes the conversation's export; the newest this many are
# kept. (Gradio serves its own copy of each, which it deletes after an hour: see delete_cache in app.py.)
MAX_EXPORTS = 100
MAX_EARLIER = 20  # conversations kept under "Earlier conversations", newest first
STORAGE_KEY = "pre-ln-gpt2-studio-chat"
# The browser keeps the conversations encrypted with this; a fixed one, so that they survive a
# restart of the app (a random one per start would make them unreadable).
STORAGE_SECRET = "pre-ln-gpt2-studio"
DEFAULT_PERSONA = PERSONAS["chatterbot"]


def message_text(message: dict) -> str:
    """The text of a Chatbot message, whose content Gradio gives as a string or a list of parts."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def pairs_from_messages(messages: list[dict]) -> list[list[str]]:
    """[user, bot] pairs from the Chatbot's messages; a turn the bot has not answered gets ""."""
    pairs: list[list[str]] = []
    for message in messages or []:
        said = message_text(message)
        if message["role"] == "user":
            pairs.append([said, ""])
        elif pairs and not pairs[-1][1]:
            pairs[-1][1] = said
        else:
            pairs.append(["", said])
    return pairs


def messages_from_pairs(pairs: list[list[str]]) -> list[dict[str, str]]:
    return [{"role": role, "content": said} for pair in pairs
            for role, said in zip(("user", "assistant"), pair) if said]


def chat_widgets() -> Widgets:
    # The conversations' tools above the conversation, so that the message box sits right under it
    # (a phone's screen had the four of them between the two); all but New chat folded away, since
    # unfolded they stood a third of a phone's screen above the conversation.
    with gr.Row():  # a button of its own size: across the page, a small one passed for a divider
        new_chat = gr.Button(i18n("new_chat"), size="md", scale=0, min_width=120, elem_id="dialogue-new")
    with gr.Accordion(i18n("conversation_tools"), open=False, elem_id="dialogue-tools"), gr.Row():
        earlier = gr.Dropdown([], value=None, label=i18n("earlier_conversations"), scale=1,
                              info=i18n("earlier_conversations_info"),
                              elem_id="dialogue-earlier")
        with gr.Column(scale=0, min_width=220):
            export = gr.DownloadButton(str(i18n("export_conversation")), size="sm", elem_id="dialogue-export")
            upload = gr.UploadButton(str(i18n("import_conversation")), file_types=[".json"], size="sm",
                                     elem_id="dialogue-import")
    # A first conversation starts with a persona, so that a greeting gets small talk back: with
    # none, the bundled model answers in whichever of its sources it drifts to (hotel bookings).
    persona = gr.Textbox(DEFAULT_PERSONA, label=i18n("persona"), placeholder=i18n("persona_placeholder"),
                         elem_id="dialogue-persona")
    # As high as the conversation, up to CHAT_CSS's height, then it scrolls: empty, it does not push
    # the message box below a phone's first screen.
    chatbot = gr.Chatbot(label=i18n("conversation"), height=None, min_height=100, buttons=["copy", "copy_all"],
                         editable="user", elem_id="dialogue-chatbot")
    with gr.Row(visible=False) as switcher:  # after Retry: every reply to the last turn stays reachable
        with gr.Column(scale=0, min_width=480), gr.Row():  # ◀ 1 / 2 ▶ side by side, not across the page
            gr.Markdown(i18n("replies_to_last"), scale=0, min_width=260, elem_id="dialogue-replies-label")
            previous_reply = gr.Button("◀", size="sm", scale=0, min_width=40, elem_id="dialogue-previous-reply")
            which_reply = gr.Markdown(scale=0, min_width=60, elem_id="dialogue-which-reply")
            next_reply = gr.Button("▶", size="sm", scale=0, min_width=40, elem_id="dialogue-next-reply")
    message = gr.Textbox(label=i18n("message"), placeholder=i18n("message_placeholder"), elem_id="dialogue-message")
    return Widgets({"message": message, "history": chatbot, "persona": persona}, output=chatbot,
                   submit=(message,), cleared=(message,),
                   more={"export": export, "new": new_chat, "import": upload, "earlier": earlier,
                         "switcher": switcher, "previous": previous_reply, "next": next_reply, "which": which_reply,
                         # after a retry, the replies to the last turn (replies_before_retry); the message box's
                         # text an edit took aside (branch_at_edit)
                         "replies": gr.State({}), "draft": gr.State("")})


def from_ui(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "history": pairs_from_messages(values["history"])}


def show_turn(values: dict[str, Any], reply: str) -> list[dict[str, str]]:
    """The conversation with the newest message and the reply so far."""
    return messages_from_pairs([*values["history"], [values["message"], reply]])


def take_back_last_turn(values: dict[str, Any]) -> dict[str, Any]:
    """Retry: the last user message again, on the history before it."""
    if not values["history"]:
        raise Refusal("no_retry")
    *history, (message, _) = values["history"]
    return {**values, "history": history, "message": message}


def branch_at_edit(messages: list[dict], box: str, draft: str,
                   edit: gr.EditData) -> tuple[list[dict[str, str]], str, str]:
    """An edited user message: the conversation before it, and its new text in the message box, to
    be sent again (the reply then follows the edited text); what the box held before (or a draft
    still waiting from an earlier edit), kept to be put back once a message has left the box
    (draft_back)."""
    index = edit.index if isinstance(edit.index, int) else edit.index[0]
    value = edit.value if isinstance(edit.value, str) else message_text({"content": edit.value})
    return messages_from_pairs(pairs_from_messages(messages[:index])), value, draft or box


def draft_back(draft: str, box: str):
    """The draft an edit took from the message box, back in it once the box is empty again: after
    the edited message has gone, or, where it was refused and stayed, after it was sent later."""
    if not draft or box:
        return gr.skip(), gr.skip()
    return draft, ""


def replies_before_retry(messages: list[dict], replies: dict, outcome: Outcome | None) -> dict:
    """Retry: the last turn's reply and its outcome, kept (with any kept before for this turn)
    to switch back to; "at" is the one shown, which the retry replaces."""
    pairs = pairs_from_messages(messages)
    if not pairs:
        return replies
    turn = len(pairs) - 1
    if replies.get("turn") == turn:
        return replies
    return {"turn": turn, "replies": [(pairs[-1][1], outcome)], "at": 0}


def after_retry(messages: list[dict], replies: dict, outcome: Outcome | None, last_run: dict) -> tuple[dict, Outcome]:
    """The kept replies with the new one joined, and its outcome. A reply that repeats the one it
    replaced, from the same run (seed, settings, counts), says why in a note: greedy decoding (the
    run's own settings, `last_run`: Insight.kept), or a fixed seed. ({}, None): the conversation's
    last turn is no longer the one retried; (replies, None): refused, the reply shown is still the
    one kept."""
    pairs = pairs_from_messages(messages)
    if not pairs or replies.get("turn") != len(pairs) - 1:
        return {}, None
    if outcome is None or not outcome.ran:
        return replies, None
    replaced, replaced_outcome = replies["replies"][replies["at"]]
    if pairs[-1][1] == replaced and outcome.reproduces(replaced_outcome):
        settings = last_run.get("values", {})
        outcome = outcome.noted(GREEDY_SAME if settings.get("temperature") == 0 or settings.get("top_k") == 1
                                else SAME_SEED)
    kept = [*replies["replies"], (pairs[-1][1], outcome)]
    return {"turn": replies["turn"], "replies": kept, "at": len(kept) - 1}, outcome


def switched(messages: list[dict], replies: dict, step: int) -> tuple[list[dict], dict, Outcome | None] | None:
    """◀ (step -1) or ▶ (+1): the conversation with the previous or next kept reply, the replies
    saying which is shown, and the outcome of the run that wrote it (its seed); None where there
    is none to switch to."""
    pairs = pairs_from_messages(messages)
    kept = replies.get("replies", [])
    if not kept or replies.get("turn") != len(pairs) - 1:
        return None
    at = (replies["at"] + step) % len(kept)
    pairs[-1][1], outcome = kept[at]
    return messages_from_pairs(pairs), {**replies, "at": at}, outcome


def which_reply(replies: dict) -> str:
    return f"{replies['at'] + 1} / {len(replies['replies'])}"


def forget_replaced(messages: list[dict], replies: dict, outcome: Outcome | None):
    """The kept replies and the switcher stay while the conversation's last turn is still the one
    they belong to, showing one of them; a new turn, an undo, a clear or another conversation
    takes them away (a refused import, which changes nothing, does not), keeping the last turn's
    reply as shown, with its outcome, for a reply continued from a chosen token to join (its
    run changes the conversation before anything could keep it)."""
    pairs = pairs_from_messages(messages)
    kept = replies.get("replies", [])
    if kept and pairs and replies.get("turn") == len(pairs) - 1 and pairs[-1][1] == kept[replies["at"]][0]:
        return gr.skip(), gr.skip()
    return replies_before_retry(messages, {}, outcome), gr.update(visible=False)  # the new last turn's reply


def undo(messages: list[dict]) -> tuple[list[dict[str, str]], str]:
    """The conversation without its last turn, whose message goes back into the message box."""
    *history, (message, _) = pairs_from_messages(messages) or [("", "")]
    return messages_from_pairs(history), message


def export_conversation(messages: list[dict], persona: str) -> str | None:
    """The conversation as a JSON file ({"persona", "history": [[user, bot], ...]}), for the
    export button; None while there is nothing to export."""
    history = pairs_from_messages(messages)
    if not history:
        return None
    # errors="replace": a lone surrogate in the text cannot be written as UTF-8.
    data = json.dumps({"persona": persona, "history": history}, ensure_ascii=False, indent=2).encode(errors="replace")
    # Named by content: the same conversation is one file, however often it is exported.
    directory = EXPORT_DIR / hashlib.sha256(data).hexdigest()[:16]
    directory.mkdir(parents=True, exist_ok=True)
    # The newest again, when the same conversation is exported once more: before writing, so that
    # another request's pruning meanwhile does not take it for an old one.
    os.utime(directory)
    path = directory / "conversation.json"
    path.write_bytes(data)
    prune_exports(directory)
    return str(path)


def prune_exports(newest: Path) -> None:
    """Delete all but the MAX_EXPORTS newest exports; `newest`, just written, stays whatever the
    clock says (file times are coarse: many exports can share one)."""
    def modified(directory: Path) -> int:
        try:
            return directory.stat().st_mtime_ns
        except FileNotFoundError:  # another request pruned it just now
            return 0
    others = sorted((d for d in EXPORT_DIR.iterdir() if d != newest), key=modified, reverse=True)
    for directory in others[MAX_EXPORTS - 1:]:
        shutil.rmtree(directory, ignore_errors=True)


def conversation_title(conversation: dict) -> str:
    """How a kept conversation is listed: its first message, and its length."""
    first = conversation["history"][0][0] if conversation["history"] else ""
    first = " ".join(first.split())
    return f"{first[:40]}{'…' if len(first) > 40 else ''} ({len(conversation['history'])})"


def earlier_choices(store: dict) -> dict:
    return gr.update(choices=[(conversation_title(c), i) for i, c in enumerate(store.get("earlier", []))],
                     value=None)


def filed(store: dict, current: dict | None) -> dict:
    """The store with `current` filed first under the earlier conversations, if it has turns."""
    earlier = list(store.get("earlier", []))
    if current and current.get("history"):
        earlier = [current, *earlier][:MAX_EARLIER]
    return {"current": None, "earlier": earlier}


def read_import(path: str | None) -> dict:
    """An exported conversation ({"persona", "history": [[user, bot], ...]}), checked as the API
    checks them."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, TypeError):  # gone from the upload folder, or no file given
        raise Refusal("unreadable_file") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Refusal("not_a_conversation", kind="not JSON") from None
    if not isinstance(data, dict):
        raise Refusal("not_a_conversation", kind="not a JSON object")
    if "history" not in data:  # {"hello": 1} is JSON, but no conversation to replace the one shown
        raise Refusal("not_a_conversation", kind="no history")
    try:
        return {"history": [list(pair) for pair in history_pairs(data.get("history", []))],
                "persona": checked_text("persona", data.get("persona", ""))}
    except ValueError as error:  # said as the API says it, and where: the file, not a box on the page
        raise Refusal("in_the_file", error=message_of(error)) from None


def chat_store() -> gr.BrowserState:
    """Where the browser keeps the conversations; made at the page's top level (app.build_app),
    outside the tabs, so that its stored value is there when the page loads."""
    return gr.BrowserState({"current": None, "earlier": []}, storage_key=STORAGE_KEY, secret=STORAGE_SECRET)


def run_record(outcome: Outcome | None, replies: dict) -> dict:
    """What a reload brings back of the reply shown: its run's outcome (the status line, with its
    seed) and, after a retry, the replies to switch between; as JSON values, for the browser."""
    def as_json(run: Outcome | None) -> dict | None:
        return run.as_json() if run is not None and run.ran else None
    kept = replies.get("replies", [])
    return {"outcome": as_json(outcome),
            "replies": {"turn": replies["turn"], "at": replies["at"],
                        "replies": [[text, as_json(run)] for text, run in kept]} if len(kept) > 1 else {}}


def run_from_record(conversation: dict) -> tuple[Outcome | None, dict]:
    """run_record's outcome and replies back, for the conversation they were kept with; the
    replies only while they still belong to its last turn. A record the app cannot read (from
    another version of it) brings back nothing."""
    pairs = conversation.get("history", [])

    def outcome(data: dict | None) -> Outcome | None:
        return None if data is None else Outcome.from_json(data)
    try:
        shown, kept = outcome(conversation.get("outcome")), conversation.get("replies") or {}
        if not (kept and pairs and kept["turn"] == len(pairs) - 1 and kept["replies"][kept["at"]][0] == pairs[-1][1]):
            return shown, {}
        return shown, {**kept, "replies": [(text, outcome(run)) for text, run in kept["replies"]]}
    except (KeyError, IndexError, TypeError, ValueError):
        return None, {}


@dataclass(frozen=True)
class KeptInBrowser:
    """The conversation, persona, adapter switch and settings kept in the browser (see the module
    docstring), with the outcome of the reply shown and the replies kept to switch between
    (run_record): saved after each change, restored on load, filed by New chat, reopened from the
    list, imported from an exported file."""
    tab: Tab

    @property
    def kept(self) -> list[gr.Component]:
        return [self.tab.widgets.output, self.tab.widgets.inputs["persona"], self.tab.adapter,
                *self.tab.settings.values()]

    @property
    def names(self) -> list[str]:
        return list(self.tab.settings)

    def current(self, messages, persona_text, adapter, *values) -> dict:
        return {"history": pairs_from_messages(messages or []), "persona": persona_text or "",
                "adapter": bool(adapter), "settings": dict(zip(self.names, values))}

    def shown(self, conversation: dict | None) -> dict:
        """The components' values for a kept conversation; what it does not keep takes the tab's
        defaults (the adapter as the model serving now starts it)."""
        tab, conversation = self.tab, conversation or {}
        defaults = {name: getattr(tab.view.task.defaults, name, None) for name in self.names} | {"seed": RANDOM_SEED}
        settings = {**defaults, **conversation.get("settings", {})}
        adapter = conversation.get("adapter", adapter_props(tab.view.task, tab.host.current)["value"])
        return dict(zip(self.kept, [messages_from_pairs(conversation.get("history", [])),
                                    conversation.get("persona", ""), adapter, *(settings[name] for name in self.names)]))

    def replaced_by(self, saved: dict, values: dict) -> dict:
        """Another conversation shown: kept, listed, and the last run's line and prompt gone."""
        tab = self.tab
        return {**values, tab.page_state: saved, tab.widgets.more["earlier"]: earlier_choices(saved),
                **tab.shown(None, "en"), tab.prompt_sent: ""}

    def save(self, saved: dict, outcome: Outcome | None, kept_replies: dict, *values) -> dict:
        return {**saved, "current": {**self.current(*values), **run_record(outcome, kept_replies)}}

    def restore(self, saved: dict, request: gr.Request) -> dict:
        more = self.tab.widgets.more
        conversation = (saved or {}).get("current")
        listed = {more["earlier"]: earlier_choices(saved or {})}
        if not conversation:
            return listed
        outcome, kept_replies = run_from_record(conversation)
        switcher = {more["switcher"]: gr.update(visible=True), more["which"]: which_reply(kept_replies)} \
            if kept_replies else {}
        return {**self.shown(conversation), **listed, **self.tab.shown(outcome, language(request)),
                more["replies"]: kept_replies, **switcher}

    def new_chat(self, saved: dict, *values) -> dict:
        saved = filed(saved or {}, self.current(*values))
        saved["current"] = {**self.current(*values), "history": []}  # the persona and settings go on
        return self.replaced_by(saved, {self.tab.widgets.output: []})

    def reopen(self, index, saved: dict, *values) -> dict:
        earlier = (saved or {}).get("earlier", [])
        if not isinstance(index, int) or not 0 <= index < len(earlier):
            return NOTHING
        chosen = earlier[index]
        saved = filed({"earlier": earlier[:index] + earlier[index + 1:]}, self.current(*values))
        saved["current"] = chosen
        return self.replaced_by(saved, self.shown(chosen))

    def imported(self, request: gr.Request, path, saved: dict, *values) -> dict:  # Gradio puts the request first
        try:
            conversation = read_import(path)
        except ValueError as error:  # the conversation shown stays; the line says why, and so does a
            lang = language(request)   # notice, since on a phone the line is a screen from the button
            gr.Warning(localized(error, lang), title=word("warning", lang))
            return self.tab.shown(Outcome.refused(error), lang)
        saved = filed(saved or {}, self.current(*values))
        saved["current"] = {**self.current(*values), **conversation}
        return self.replaced_by(saved, self.shown(saved["current"]))

    def wire(self, export: dict, changed: list, forgetting: list[dict]) -> None:
        """Saved after each change (`changed`: the events that change the conversation, besides
        the edits of its boxes) and restored on load; each of the events that shows another
        conversation makes the export button's file too, and forgets what spoke of the one it
        replaces (`forgetting`: the events' arguments)."""
        tab, kept, store, more = self.tab, self.kept, self.tab.page_state, self.tab.widgets.more
        private = dict(queue=False, api_visibility="private")
        restored = {*kept, more["earlier"], tab.status, tab.outcome, more["replies"], more["switcher"], more["which"]}
        tab.page.blocks.load(self.restore, store, restored, **private).then(**export)
        saving = dict(fn=self.save, inputs=[store, tab.outcome, more["replies"], *kept], outputs=store, **private)
        for change in changed:
            change.then(**saving)
        persona = tab.widgets.inputs["persona"]
        gr.on([persona.blur, persona.submit, tab.adapter.input, tab.widgets.output.undo, tab.widgets.output.clear,
               *(slider.release if hasattr(slider, "release") else slider.blur for slider in tab.settings.values())],
              **saving)
        replacing = {*kept, store, more["earlier"], tab.status, tab.outcome, tab.prompt_sent}
        for replaced in (
                more["new"].click(self.new_chat, [store, *kept], replacing, **private),
                more["earlier"].input(self.reopen, [more["earlier"], store, *kept], replacing, **private),
                # Queued, as a notice (gr.Warning) needs: a refused file says so beside the button too.
                more["import"].upload(self.imported, [more["import"], store, *kept], replacing,
                                      api_visibility="private")):
            replaced.then(**export)
            for forget in forgetting:
                replaced.then(**forget)


PRIVATE = dict(queue=False, api_visibility="private")  # the page's own events, none of them a run


def chat_extras(tab: Tab) -> None:
    """Chat's own events: retry and the replies kept to switch between, an edited message, undo
    and clear, the export, and the copy kept in the browser."""
    chatbot, persona, more = tab.widgets.output, tab.widgets.inputs["persona"], tab.widgets.more
    forget_replies = dict(fn=forget_replaced, inputs=[chatbot, more["replies"], tab.outcome],
                          outputs=[more["replies"], more["switcher"]], **PRIVATE)
    # The token view, Compare's texts and a clicked token's alternatives speak of the reply last
    # drawn: they go when it goes (undo, clear, another conversation) or another reply is shown.
    forget_shown_run = dict(fn=Insight.forgotten, inputs=None, outputs=tab.insight.of_the_shown_run, **PRIVATE)
    settled = wire_retry(tab)
    switches = wire_reply_switcher(tab)
    wire_edit(tab)
    undone, cleared = wire_undo_and_clear(tab)
    for switched_reply in switches:
        switched_reply.then(**forget_shown_run)
    for new_turn in [*tab.runs["run"], *tab.runs["edit"], undone, cleared]:  # a message sent or edited, or taken back
        settled.append(new_turn.then(**forget_replies))
    for other in (undone, cleared):
        other.then(**forget_shown_run)
    # Exported when a run, an undo, a clear or a switch to another kept reply has finished, not on
    # every change of the chatbot: a streaming reply changes it with every chunk. (Stop lets the
    # run end by itself, so its partial reply is exported too; a run cancelled while queued had
    # changed nothing.)
    export = dict(fn=export_conversation, inputs=[chatbot, persona], outputs=more["export"], **PRIVATE)
    for finished in [*tab.all_runs, undone, cleared, *switches]:
        finished.then(**export)
    gr.on([persona.blur, persona.submit], **export)  # once the persona is typed, not per keystroke
    KeptInBrowser(tab).wire(export, [*tab.all_runs, *switches, *settled], [forget_replies, forget_shown_run])


def wire_retry(tab: Tab) -> list:
    """Retry, and a reply continued from a chosen token (forget_replaced kept the reply it
    replaces), keep the reply they replace to switch back to; the events that change the reply's
    outcome or the kept replies, which the browser keeps once they have."""
    chatbot, more = tab.widgets.output, tab.widgets.more
    replies, switcher, which = more["replies"], more["switcher"], more["which"]
    chatbot.retry(replies_before_retry, [chatbot, replies, tab.outcome], replies, **PRIVATE)
    tab.add_run("retry", [chatbot.retry], prepare=take_back_last_turn)

    def retried(messages: list[dict], kept: dict, outcome: Outcome | None, last_run: dict, request: gr.Request):
        kept, outcome = after_retry(messages, kept, outcome, last_run)
        if not kept:
            return {replies: {}, switcher: gr.update(visible=False), which: ""}
        if outcome is None:
            return NOTHING
        return {replies: kept, switcher: gr.update(visible=True), which: which_reply(kept),
                **tab.shown(outcome, language(request))}

    return [replaced.then(retried, [chatbot, replies, tab.outcome, tab.insight.last_run],
                          {replies, switcher, which, tab.status, tab.outcome}, **PRIVATE)
            for replaced in (*tab.runs["retry"], *tab.runs["from_token"])]


def wire_reply_switcher(tab: Tab) -> list:
    """◀ and ▶ between the replies kept after a retry: their events."""
    chatbot, more = tab.widgets.output, tab.widgets.more
    replies, which = more["replies"], more["which"]

    def switch(step: int):
        def to_reply(messages: list[dict], kept: dict, request: gr.Request):
            found = switched(messages, kept, step)
            if found is None:
                return NOTHING
            messages, kept, outcome = found
            return {chatbot: messages, replies: kept, which: which_reply(kept), **tab.shown(outcome, language(request))}
        return to_reply

    return [button.click(switch(step), [chatbot, replies], {chatbot, replies, which, tab.status, tab.outcome},
                         **PRIVATE)
            for step, button in ((-1, more["previous"]), (1, more["next"]))]


def wire_edit(tab: Tab) -> None:
    """An edited user message is sent again (branch_at_edit), the message box's draft kept aside
    and put back once a message has left the box (draft_back)."""
    chatbot, message, draft = tab.widgets.output, tab.widgets.inputs["message"], tab.widgets.more["draft"]
    edited = chatbot.edit(branch_at_edit, [chatbot, message, draft], [chatbot, message, draft], **PRIVATE)
    for new_turn in [*tab.runs["run"], *tab.add_run("edit", [edited])]:  # a message sent, or an edited one
        new_turn.then(draft_back, [draft, message], [message, draft], **PRIVATE)


def wire_undo_and_clear(tab: Tab) -> tuple:
    """Undo and clear: the status line and the prompt sent go with the reply they spoke of, as in
    another conversation. Their events."""
    chatbot, message = tab.widgets.output, tab.widgets.inputs["message"]
    gone = {**tab.shown(None, "en"), tab.prompt_sent: ""}
    undone = chatbot.undo(lambda messages: {**dict(zip((chatbot, message), undo(messages))), **gone}, chatbot,
                          {chatbot, message, *gone}, **PRIVATE)
    cleared = chatbot.clear(lambda: {chatbot: [], **gone}, None, {chatbot, *gone}, **PRIVATE)
    return undone, cleared


CHAT = TaskView(
    api=CHAT_API,
    label="tab_dialogue", run_label="send", intro="intro_dialogue", build=chat_widgets,
    # Requests of the kinds the bundled model learned, each with the persona line of its source.
    examples=[["Hi, I'd like to order a coffee, please.", PERSONAS["taskmaster"]],
              ["I want to book a hotel in Paris.", PERSONAS["sgd"]],
              ["Can you find me a restaurant in San Jose?", PERSONAS["sgd"]]],
    example_inputs=("message", "persona"),
    example_labels={"en": ["Order a coffee (coffee shop)", "Book a hotel (virtual assistant)",
                           "Find a restaurant (virtual assistant)"],
                    "zh": ["点一杯咖啡（咖啡店）", "订一家酒店（虚拟助理）", "找一家餐馆（虚拟助理）"]},
    from_ui=from_ui, present=show_turn, extras=chat_extras, page_state=chat_store,
)

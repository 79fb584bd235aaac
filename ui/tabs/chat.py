"""The Chat tab: a gr.Chatbot conversation with a persona line, retry / undo / clear, an edited
message sent again or an edited reply written over by hand, and the conversation exported as JSON
and imported back.

The conversation is a record (ui/conversation.py: each turn's message, every reply drawn for it
with the seed and settings of its run, and the one shown), kept in a gr.State, changed by the
handlers and drawn to the Chatbot by one function (showing); nothing is read back from the
Chatbot. The record, the adapter switch and the decoding settings are kept in the browser's own
storage (gr.BrowserState: per browser, never on the server), so they survive a reload; "New chat"
files the conversation under "Earlier conversations", from where it can be reopened, and starts an
empty one with the same persona, adapter and settings (as chat apps keep their settings across
conversations).

The API (/chat) takes the history as [user, bot] pairs, which an exported conversation also
gives (its "history"), so a conversation saved from the browser can be sent back through the API
as it is.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import Any

import gradio as gr

from serve import PERSONAS
from serve.host import Host
from serve.messages import Refusal, localized, message_of, render
from serve.outcome import GREEDY_SAME, SAME_SEED, Outcome
from serve.apis import CHAT_API
from serve.running import RANDOM_SEED, setting_params

from ..conversation import Conversation, Reply
from ..exports import newest_export
from ..i18n import i18n
from ..last_run import LastRun
from ..messages import BROWSER_SECRET, language, warn
from ..tab import NOTHING, PAGE_EVENT, Tab, TaskView, Widgets, adapter_props
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
# Editing a message in the conversation (the user's or the bot's), Enter saves the edit and Escape
# cancels it, as in the message box (Shift+Enter starts a new line): Gradio's edit box took Enter as
# a new line, kept in the message sent, and saving it needed its small ✓. Its two buttons, ✓ then
# ✗, are found by place (after the message, on its side), since their names follow the page's language.
EDIT_KEYS_JS = """() => {
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLTextAreaElement) || !box.closest("#dialogue-chatbot") || event.isComposing
        || event.keyCode === 229 || !(event.key === "Escape" || (event.key === "Enter" && !event.shiftKey))) return;
    let after = box.closest(".message-row")?.nextElementSibling;  // the edited message's buttons follow it
    while (after && !after.matches(".message-buttons, .message-row")) after = after.nextElementSibling;
    const button = after?.matches(".message-buttons") && after.querySelectorAll("button")[event.key === "Enter" ? 0 : 1];
    if (!button) return;
    event.preventDefault();
    button.click();
  });
}"""
EXPORT_DIR = Path(tempfile.gettempdir()) / "pre-ln-gpt2-studio" / "conversations"
# Every finished turn, undo or clear writes the conversation's export; the newest this many are
# kept (ui/exports.py).
MAX_EXPORTS = 100
MAX_EARLIER = 20  # conversations kept under "Earlier conversations", newest first
STORAGE_KEY = "pre-ln-gpt2-studio-chat"
DEFAULT_PERSONA = PERSONAS["chatterbot"]


def message_text(message: dict) -> str:
    """The text of a Chatbot message, whose content Gradio gives as a string or a list of parts."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def messages_from_pairs(pairs: list[list[str]]) -> list[dict[str, str]]:
    """The Chatbot's messages for [user, bot] pairs: the one way a conversation is drawn, whole
    (showing) or with a reply still streaming (show_turn); an empty message is left out."""
    return [{"role": role, "content": said} for pair in pairs
            for role, said in zip(("user", "assistant"), pair) if said]


def message_place(conversation: Conversation, index: int) -> tuple[int, bool]:
    """The turn of the Chatbot's message at `index`, as messages_from_pairs draws them, and whether
    it is the user's message (else the bot's reply); past the end, a user's after the last turn."""
    places = [(at, role == "user") for at, pair in enumerate(conversation.pairs)
              for role, said in zip(("user", "assistant"), pair) if said]
    return places[index] if 0 <= index < len(places) else (len(conversation.turns), True)


def edited_text(edit: gr.EditData) -> str:
    """An edited message's new text (Gradio gives a string, or the message's parts)."""
    return edit.value if isinstance(edit.value, str) else message_text({"content": edit.value})


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
    # It takes typing once the page's restore of what this browser kept has landed
    # (KeptInBrowser.restore): text typed before then would be overwritten by the kept persona.
    persona = gr.Textbox(DEFAULT_PERSONA, label=i18n("persona"), placeholder=i18n("persona_placeholder"),
                         interactive=False, elem_id="dialogue-persona")
    # As high as the conversation, up to CHAT_CSS's height, then it scrolls: empty, it does not push
    # the message box below a phone's first screen.
    chatbot = gr.Chatbot(label=i18n("conversation"), height=None, min_height=100, buttons=["copy", "copy_all"],
                         editable="all", elem_id="dialogue-chatbot")
    with gr.Row(visible=False) as switcher:  # after Retry: every reply to the last turn stays reachable
        with gr.Column(scale=0, min_width=480), gr.Row():  # ◀ 1 / 2 ▶ side by side, not across the page
            gr.Markdown(i18n("replies_to_last"), scale=0, min_width=260, elem_id="dialogue-replies-label")
            previous_reply = gr.Button("◀", size="sm", scale=0, min_width=40, elem_id="dialogue-previous-reply")
            which_reply = gr.Markdown(scale=0, min_width=60, elem_id="dialogue-which-reply")
            next_reply = gr.Button("▶", size="sm", scale=0, min_width=40, elem_id="dialogue-next-reply")
    # "", not Gradio's None: an untouched box is an empty message (a run says so; the context line counts it)
    message = gr.Textbox("", label=i18n("message"), placeholder=i18n("message_placeholder"), elem_id="dialogue-message")
    context = gr.Markdown(elem_id="dialogue-context")  # how much of the context the next prompt takes (context_line)
    # The conversation's record (ui/conversation.py), the one the Chatbot shows: a run reads its
    # history from it, not from the Chatbot.
    conversation = gr.State(Conversation(DEFAULT_PERSONA))
    return Widgets({"message": message, "history": conversation, "persona": persona}, output=chatbot,
                   submit=(message,), cleared=(message,),
                   more={"export": export, "new": new_chat, "import": upload, "earlier": earlier,
                         "switcher": switcher, "previous": previous_reply, "next": next_reply, "which": which_reply,
                         "conversation": conversation, "context": context,
                         "draft": gr.State(""),  # the message box's text an edit took aside (branch_at_edit)
                         "sending": gr.State(False)})  # whether the last edit sends a message (wire_edit)


def from_ui(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "history": values["history"].pairs}


def show_turn(values: dict[str, Any], reply: str) -> list[dict[str, str]]:
    """The conversation with the newest message and the reply so far."""
    return messages_from_pairs([*values["history"], [values["message"], reply]])


def take_back_last_turn(values: dict[str, Any]) -> dict[str, Any]:
    """Retry: the last user message again, on the history before it."""
    if not values["history"]:
        raise Refusal("no_retry")
    *history, (message, _) = values["history"]
    return {**values, "history": history, "message": message}


def showing(tab: Tab, conversation: Conversation) -> dict:
    """The record kept and drawn: the Chatbot's messages, and ◀ n / m ▶ where the last turn has
    more than one reply (after a retry)."""
    more = tab.widgets.more
    last = conversation.turns[-1] if conversation.turns else None
    several = last is not None and len(last.replies) > 1
    return {more["conversation"]: conversation, tab.widgets.output: messages_from_pairs(conversation.pairs),
            more["switcher"]: gr.update(visible=several),
            more["which"]: f"{last.shown + 1} / {len(last.replies)}" if several else ""}


def shown_parts(tab: Tab) -> set:
    """What `showing` sets."""
    more = tab.widgets.more
    return {more["conversation"], tab.widgets.output, more["switcher"], more["which"]}


def branch_at_edit(conversation: Conversation, at: int, text: str, box: str,
                   draft: str) -> tuple[Conversation, str, str]:
    """The user's message of turn `at` edited to `text`: the conversation before its turn, and the
    text in the message box, to be sent again (the reply then follows the edited text); what the
    box held before (or a draft still waiting from an earlier edit), kept to be put back once a
    message has left the box (draft_back)."""
    return conversation.before(at), text, draft or box


def reply_edited(tab: Tab, conversation: Conversation, at: int, text: str, lang: str) -> dict:
    """The reply of turn `at` written over by hand (Conversation.edited). Where it is the last
    turn's, the status line says so, and what spoke of the run that drew it goes (the token view);
    an earlier one leaves them to the last reply, of which they speak."""
    edited = conversation.edited(at, text)
    if at < len(edited.turns) - 1:
        return showing(tab, edited)
    forgotten = dict(zip(tab.insight.of_the_shown_run, Insight.forgotten()))
    return {**showing(tab, edited), **tab.shown(LastRun(edited.turns[at].reply.outcome), lang), **forgotten}


def draft_back(draft: str, box: str):
    """The draft an edit took from the message box, back in it once the box is empty again: after
    the edited message has gone, or, where it was refused and stayed, after it was sent later."""
    if not draft or box:
        return gr.skip(), gr.skip()
    return draft, ""


def answered(conversation: Conversation, last_run: LastRun) -> tuple[Conversation, Outcome] | None:
    """The conversation with the reply a run has just drawn (`last_run`: the message it answered,
    the history it followed, its text and persona), as a new turn or beside the reply it replaced
    (a retry), and its outcome. A reply that repeats the one it replaced, from the same run (seed,
    settings, counts), says why in a note: greedy decoding, or a fixed seed. A compared turn keeps
    both sides as its replies, the side shown last: ◀ ▶ picks the one the conversation goes on with.
    None where the run drew no reply (refused, failed, or stopped before it ran: `last_run` is an
    older run's, already recorded)."""
    outcome, ran_with, text = last_run.outcome, last_run.values, last_run.output
    if outcome is None or not outcome.ran:
        return None
    at, user = len(ran_with.get("history", [])), ran_with.get("message", "")
    if at < len(conversation.turns) and conversation.turns[at].user == user:
        turn = conversation.turns[at]
        if any(reply.outcome == outcome for reply in turn.replies):
            return None
        if turn.reply.text == text and outcome.reproduces(turn.reply.outcome):
            greedy = ran_with.get("temperature") == 0 or ran_with.get("top_k") == 1
            outcome = outcome.noted(GREEDY_SAME if greedy else SAME_SEED)
    conversation = replace(conversation, persona=ran_with.get("persona", conversation.persona))
    if last_run.other is not None:
        conversation = conversation.answered(at, user, Reply(*last_run.other))
    return conversation.answered(at, user, Reply(text, outcome)), outcome


def undo(conversation: Conversation) -> tuple[Conversation, str]:
    """The conversation without its last turn, whose message goes back into the message box."""
    if not conversation.turns:
        return conversation, ""
    return conversation.before(len(conversation.turns) - 1), conversation.turns[-1].user


def export_conversation(conversation: Conversation) -> str | None:
    """The conversation as a JSON file (Conversation.as_json: the persona, each turn's message and
    replies with their runs, and which is shown; the shown ones as /chat's history too), for the
    export button; None while there is nothing to export."""
    if not conversation.turns:
        return None
    # errors="replace": a lone surrogate in the text cannot be written as UTF-8.
    data = json.dumps(conversation.as_json(), ensure_ascii=False, indent=2).encode(errors="replace")
    # Named by content: the same conversation is one file, however often it is exported.
    path = newest_export(EXPORT_DIR, hashlib.sha256(data).hexdigest()[:16], MAX_EXPORTS) / "conversation.json"
    path.write_bytes(data)
    return str(path)


def stored_conversation(kept: dict) -> Conversation:
    """The conversation of a kept one (KeptInBrowser.current); one an older version of the app
    kept (its "persona" and "history" beside the settings) reads as an older export does, and one
    this app cannot read at all is an empty one."""
    try:
        return Conversation.from_json(kept.get("conversation", kept))
    except (KeyError, TypeError, ValueError):
        return Conversation()


def conversation_title(kept: dict) -> str:
    """How a kept conversation is listed: its first message, and its length."""
    turns = stored_conversation(kept).turns
    first = " ".join(turns[0].user.split()) if turns else ""
    return f"{first[:40]}{'…' if len(first) > 40 else ''} ({len(turns)})"


def earlier_choices(store: dict) -> dict:
    return gr.update(choices=[(conversation_title(c), i) for i, c in enumerate(store.get("earlier", []))],
                     value=None)


def filed(store: dict, current: dict | None) -> dict:
    """The store with `current` filed first under the earlier conversations, if it has turns."""
    earlier = list(store.get("earlier", []))
    if current and stored_conversation(current).turns:
        earlier = [current, *earlier][:MAX_EARLIER]
    return {"current": None, "earlier": earlier}


def read_import(path: str | None) -> Conversation:
    """An exported conversation (Conversation.as_json, or an older export's {"persona", "history":
    [[user, bot], ...]}), checked as the API checks them."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, TypeError):  # gone from the upload folder, or no file given
        raise Refusal("unreadable_file") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Refusal("not_a_conversation", kind="not JSON") from None
    if not isinstance(data, dict):
        raise Refusal("not_a_conversation", kind="not a JSON object")
    if "history" not in data and "turns" not in data:  # {"hello": 1} is JSON, but no conversation
        raise Refusal("not_a_conversation", kind="no history")
    try:
        return Conversation.from_json(data)
    except ValueError as error:  # said as the API says it, and where: the file, not a box on the page
        raise Refusal("in_the_file", error=message_of(error)) from None


def chat_store() -> gr.BrowserState:
    """Where the browser keeps the conversations; made at the page's top level (app.build_app),
    outside the tabs, so that its stored value is there when the page loads."""
    return gr.BrowserState({"current": None, "earlier": []}, storage_key=STORAGE_KEY, secret=BROWSER_SECRET)


@dataclass(frozen=True)
class KeptInBrowser:
    """The conversation (its record, with the persona), the adapter switch and settings kept in the
    browser (see the module docstring): saved after each change, restored on load, filed by New
    chat, reopened from the list, imported from an exported file."""
    tab: Tab

    @property
    def kept(self) -> list[gr.Component]:
        more = self.tab.widgets.more
        return [more["conversation"], self.tab.widgets.inputs["persona"], self.tab.adapter,
                *self.tab.settings.values()]

    @property
    def names(self) -> list[str]:
        return list(self.tab.settings)

    def current(self, conversation: Conversation, persona_text, adapter, *values) -> dict:
        """What the browser keeps of the conversation shown, with the persona as its box says."""
        return {"conversation": replace(conversation, persona=persona_text or "").as_json(),
                "adapter": bool(adapter), "settings": dict(zip(self.names, values))}

    def shown(self, kept: dict) -> dict:
        """The components' values for a kept conversation; what it does not keep takes the tab's
        defaults (the adapter as the model serving now starts it)."""
        tab = self.tab
        conversation = stored_conversation(kept)
        defaults = {param.name: param.default for param in setting_params(tab.view.task)} | {"seed": RANDOM_SEED}
        settings = {**defaults, **kept.get("settings", {})}
        adapter = kept.get("adapter", adapter_props(tab.view.task, tab.host.current)["value"])
        return {**showing(tab, conversation), tab.widgets.inputs["persona"]: conversation.persona,
                tab.adapter: adapter, **{tab.settings[name]: settings[name] for name in self.names}}

    def replaced_by(self, saved: dict, values: dict) -> dict:
        """Another conversation shown: kept, listed, and the last run, its line and prompt gone
        with the conversation it answered."""
        tab = self.tab
        return {**values, tab.page_state: saved, tab.widgets.more["earlier"]: earlier_choices(saved),
                **tab.shown(LastRun(), "en"), tab.prompt_sent: ""}

    def save(self, saved: dict, *values) -> dict:
        return {**saved, "current": self.current(*values)}

    def restore(self, saved: dict, request: gr.Request) -> dict:
        """The conversation kept, with the status line of its last reply's run; the persona box
        takes typing from now on (chat_widgets), showing the kept persona where there is one."""
        conversation = (saved or {}).get("current")
        persona = self.tab.widgets.inputs["persona"]
        ready = {self.tab.widgets.more["earlier"]: earlier_choices(saved or {}), persona: gr.update(interactive=True)}
        if not conversation:
            return ready
        turns = stored_conversation(conversation).turns
        last_reply = LastRun(turns[-1].reply.outcome if turns else None)  # on load: no run in this page yet
        shown = self.shown(conversation)
        return {**shown, **ready, persona: gr.update(value=shown[persona], interactive=True),
                **self.tab.shown(last_reply, language(request))}

    def new_chat(self, saved: dict, *values) -> dict:
        current = self.current(*values)
        saved = filed(saved or {}, current)
        fresh = Conversation(current["conversation"]["persona"])  # the persona and settings go on
        saved["current"] = {**current, "conversation": fresh.as_json()}
        return self.replaced_by(saved, showing(self.tab, fresh))

    def reopen(self, index, saved: dict, *values) -> dict:
        earlier = (saved or {}).get("earlier", [])
        if not isinstance(index, int) or not 0 <= index < len(earlier):
            return NOTHING
        chosen = earlier[index]
        saved = filed({"earlier": earlier[:index] + earlier[index + 1:]}, self.current(*values))
        saved["current"] = chosen
        return self.replaced_by(saved, self.shown(chosen))

    def imported(self, request: gr.Request, path, saved: dict, last_run: LastRun,
                 *values) -> dict:  # Gradio puts the request first
        try:
            conversation = read_import(path)
        except ValueError as error:  # the conversation shown stays; the line says why, and so does a
            lang = language(request)   # notice, since on a phone the line is a screen from the button
            warn(localized(error, lang), lang)
            return self.tab.shown(last_run.with_outcome(Outcome.refused(error)), lang)
        saved = filed(saved or {}, self.current(*values))
        saved["current"] = {**self.current(*values), "conversation": conversation.as_json()}
        return self.replaced_by(saved, self.shown(saved["current"]))

    def wire(self, follow_ups: list[dict], changed: list, forget_shown_run: dict) -> None:
        """Saved after each change (`changed`: the events that change the conversation's record)
        and restored on load; the restore and each of the events that shows another conversation
        are followed by what follows every change of the record (`follow_ups`: the export button's
        file, the context line), and the latter forget what spoke of the one it replaces (forget_shown_run)."""
        tab, kept, store, more = self.tab, self.kept, self.tab.page_state, self.tab.widgets.more
        restored = {*kept, *shown_parts(tab), more["earlier"], tab.status, tab.last_run}
        restore = tab.page.blocks.load(self.restore, store, restored, **PAGE_EVENT)
        for follow in follow_ups:
            restore.then(**follow)
        saving = dict(fn=self.save, inputs=[store, *kept], outputs=store, **PAGE_EVENT)
        for change in [*changed, *tab.presets.applied]:
            change.then(**saving)
        gr.on([tab.adapter.input,
               *(slider.release if hasattr(slider, "release") else slider.blur for slider in tab.settings.values())],
              **saving)
        replacing = {*kept, *shown_parts(tab), store, more["earlier"], tab.status, tab.last_run, tab.prompt_sent}
        for replaced in (
                more["new"].click(self.new_chat, [store, *kept], replacing, **PAGE_EVENT),
                more["earlier"].input(self.reopen, [more["earlier"], store, *kept], replacing, **PAGE_EVENT),
                # Queued, as a notice (gr.Warning) needs: a refused file says so beside the button too.
                more["import"].upload(self.imported, [more["import"], store, tab.last_run, *kept], replacing,
                                      api_visibility="private")):
            for follow in (*follow_ups, forget_shown_run):
                replaced.then(**follow)


def chat_extras(tab: Tab) -> None:
    """Chat's own events: each run's reply recorded, the replies kept to switch between, an edited
    message, undo and clear, the persona, the export, and the copy kept in the browser."""
    conversation = tab.widgets.more["conversation"]
    # The token view, Compare's texts and a clicked token's alternatives speak of the reply last
    # drawn: they go when it goes (undo, clear, another conversation) or another reply is shown.
    forget_shown_run = dict(fn=Insight.forgotten, inputs=None, outputs=tab.insight.of_the_shown_run, **PAGE_EVENT)
    edited = wire_edit(tab)
    tab.add_run("retry", [tab.widgets.output.retry], prepare=take_back_last_turn)
    switches, taken_back = wire_reply_switcher(tab), wire_undo_and_clear(tab)
    for other in (*switches, *taken_back):
        other.then(**forget_shown_run)
    # Exported, and the context line counted again, when a run, an undo, a clear or a switch to
    # another kept reply has finished, not on every change of the chatbot: a streaming reply
    # changes it with every chunk. (Stop lets the run end by itself, so its partial reply is
    # recorded and exported too; a run cancelled while queued had changed nothing.)
    export = dict(fn=export_conversation, inputs=conversation, outputs=tab.widgets.more["export"], **PAGE_EVENT)
    follow_ups = [export, counted_again(tab)]
    changed = [*wire_answers(tab), *switches, *taken_back, edited, wire_persona(tab)]
    for change, follow in product(changed, follow_ups):
        change.then(**follow)
    KeptInBrowser(tab).wire(follow_ups, changed, forget_shown_run)


def context_line(host: Host):
    """How much of the context the prompt the next message goes in takes (with the message as far
    as it is typed), and the oldest turns it will leave out to fit (Host.conversation_room), or why
    a run would refuse it."""
    def line(conversation: Conversation, message: str, persona: str, max_new_tokens, request: gr.Request) -> str:
        lang = language(request)
        try:
            parts = host.conversation_room(message, conversation.pairs, persona, max_new_tokens)
        except ValueError as error:  # what a run would answer
            return localized(error, lang)
        return " · ".join(render(part, lang) for part in parts)
    return line


def counted_again(tab: Tab) -> dict:
    """The context line's event: counted again as the message, the persona or max_new_tokens
    change; and, with this as what follows them, after each change of the conversation's record
    (chat_extras)."""
    more, inputs, max_new_tokens = tab.widgets.more, tab.widgets.inputs, tab.settings["max_new_tokens"]
    count = dict(fn=context_line(tab.host), inputs=[more["conversation"], inputs["message"], inputs["persona"],
                                                    max_new_tokens],
                 outputs=more["context"], trigger_mode="always_last", **PAGE_EVENT)
    gr.on([inputs["message"].change, inputs["persona"].change, max_new_tokens.change], **count)
    return count


def wire_answers(tab: Tab) -> list:
    """Each run's reply recorded in the conversation once the run has ended (answered): a new turn
    (Send, an edited message), or a reply beside the one it replaces (Retry, a reply continued from
    a chosen token). Their events."""
    def recorded(conversation: Conversation, last_run: LastRun, request: gr.Request):
        found = answered(conversation, last_run)
        if found is None:
            return NOTHING
        conversation, outcome = found
        return {**showing(tab, conversation), **tab.shown(last_run.with_outcome(outcome), language(request))}

    return [run.then(recorded, [tab.widgets.more["conversation"], tab.last_run],
                     {*shown_parts(tab), tab.status, tab.last_run}, **PAGE_EVENT)
            for run in tab.all_runs]


def wire_reply_switcher(tab: Tab) -> list:
    """◀ and ▶ between the replies to the last turn, each with its run's status line: their events."""
    conversation, more = tab.widgets.more["conversation"], tab.widgets.more

    def switch(step: int):
        def to_reply(kept: Conversation, last_run: LastRun, request: gr.Request):
            switched = kept.switched(step)
            if switched is None:
                return NOTHING
            shown = last_run.with_outcome(switched.turns[-1].reply.outcome)
            return {**showing(tab, switched), **tab.shown(shown, language(request))}
        return to_reply

    return [button.click(switch(step), [conversation, tab.last_run], {*shown_parts(tab), tab.status, tab.last_run},
                         **PAGE_EVENT)
            for step, button in ((-1, more["previous"]), (1, more["next"]))]


def wire_edit(tab: Tab):
    """An edited user message is sent again (branch_at_edit), the message box's draft kept aside
    and put back once a message has left the box (draft_back); an edited reply of the bot's is
    written over by hand (reply_edited), and nothing runs. The edit's event."""
    chatbot, message, more = tab.widgets.output, tab.widgets.inputs["message"], tab.widgets.more
    draft, sending = more["draft"], more["sending"]

    def edited(conversation: Conversation, box: str, kept_draft: str, edit: gr.EditData, request: gr.Request):
        at, users = message_place(conversation, edit.index if isinstance(edit.index, int) else edit.index[0])
        if not users:
            return {**reply_edited(tab, conversation, at, edited_text(edit), language(request)), sending: False}
        before, text, kept_draft = branch_at_edit(conversation, at, edited_text(edit), box, kept_draft)
        return {**showing(tab, before), message: text, draft: kept_draft, sending: True}

    changed = {*shown_parts(tab), message, draft, sending, tab.status, tab.last_run, *tab.insight.of_the_shown_run}
    edit = chatbot.edit(edited, [more["conversation"], message, draft], changed, **PAGE_EVENT)
    for new_turn in [*tab.runs["run"], *tab.add_run("edit", [edit], when=sending)]:  # a message sent, or an edited one
        new_turn.then(draft_back, [draft, message], [message, draft], **PAGE_EVENT)
    return edit


def wire_undo_and_clear(tab: Tab) -> tuple:
    """Undo and clear: the status line and the prompt sent go with the reply they spoke of, as in
    another conversation. Their events."""
    chatbot, message, conversation = tab.widgets.output, tab.widgets.inputs["message"], tab.widgets.more["conversation"]
    gone = {**tab.shown(LastRun(), "en"), tab.prompt_sent: ""}  # the last run goes with the reply it drew
    outputs = {*shown_parts(tab), *gone}

    def undone(kept: Conversation) -> dict:
        kept, text = undo(kept)
        return {**showing(tab, kept), message: text, **gone}

    return (chatbot.undo(undone, conversation, {*outputs, message}, **PAGE_EVENT),
            chatbot.clear(lambda kept: {**showing(tab, Conversation(kept.persona)), **gone}, conversation, outputs,
                          **PAGE_EVENT))


def wire_persona(tab: Tab):
    """The persona, once typed (not per keystroke), becomes the record's: its event."""
    persona, conversation = tab.widgets.inputs["persona"], tab.widgets.more["conversation"]
    return gr.on([persona.blur, persona.submit], lambda kept, text: replace(kept, persona=text),
                 [conversation, persona], conversation, **PAGE_EVENT)


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

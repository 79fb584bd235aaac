"""The Chat tab: a gr.Chatbot conversation with a persona line, retry / undo / clear, and the
conversation exported as JSON.

The API (/chat) takes the history as [user, bot] pairs, the shape an exported conversation has,
so a conversation saved from the browser can be sent back through the API as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from tasks import TASKS, DialogueInputs

from .i18n import i18n
from .running import MAX_CHARS, MAX_CHAT_TURNS, Param, TaskAPI, check_size, checked_text
from .tab import Tab, TaskView, Widgets

EXPORT_DIR = Path(tempfile.gettempdir()) / "pre-ln-gpt2-studio" / "conversations"
# Every finished turn, undo or clear writes the conversation's export; the newest this many are
# kept. (Gradio serves its own copy of each, which it deletes after an hour: see delete_cache in app.py.)
MAX_EXPORTS = 100


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


def history_pairs(history: Any) -> list[tuple[str, str]]:
    """The API's history, checked: a list of [user, bot] pairs of text, within the limits."""
    is_list = isinstance(history, (list, tuple))
    if is_list:
        check_size("history", len(history), MAX_CHAT_TURNS, "turns")  # before its turns are walked
    if not is_list or not all(isinstance(turn, (list, tuple)) and len(turn) == 2
                              and all(isinstance(said, str) for said in turn) for turn in history):
        raise ValueError("history must be a list of [user, bot] pairs of text")
    check_size("history", sum(len(user) + len(bot) for user, bot in history), MAX_CHARS["history"], "characters")
    return [(user, bot) for user, bot in history]


def chat_widgets() -> Widgets:
    persona = gr.Textbox(label=i18n("persona"), placeholder=i18n("persona_placeholder"), elem_id="dialogue-persona")
    chatbot = gr.Chatbot(label=i18n("conversation"), height=360, buttons=["copy", "copy_all"],
                         elem_id="dialogue-chatbot")
    with gr.Row():
        export = gr.DownloadButton(str(i18n("export_conversation")), size="sm", scale=0, elem_id="dialogue-export")
    message = gr.Textbox(label=i18n("message"), placeholder=i18n("message_placeholder"), elem_id="dialogue-message")
    return Widgets({"message": message, "history": chatbot, "persona": persona}, output=chatbot,
                   submit=(message,), cleared=(message,), more={"export": export})


def from_ui(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "history": pairs_from_messages(values["history"])}


def show_turn(values: dict[str, Any], reply: str) -> list[dict[str, str]]:
    """The conversation with the newest message and the reply so far."""
    return messages_from_pairs([*values["history"], [values["message"], reply]])


def take_back_last_turn(values: dict[str, Any]) -> dict[str, Any]:
    """Retry: the last user message again, on the history before it."""
    if not values["history"]:
        raise ValueError("there is no turn to retry")
    *history, (message, _) = values["history"]
    return {**values, "history": history, "message": message}


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


def chat_extras(tab: Tab) -> None:
    chatbot, message, persona = (tab.widgets.inputs[name] for name in ("history", "message", "persona"))
    tab.add_run([chatbot.retry], prepare=take_back_last_turn)
    undone = chatbot.undo(undo, chatbot, [chatbot, message], queue=False, api_visibility="private")
    cleared = chatbot.clear(lambda: ([], "", ""), None, [chatbot, tab.status, tab.prompt_sent], queue=False,
                            api_visibility="private")
    # Exported when a run, an undo or a clear has finished, not on every change of the chatbot:
    # a streaming reply changes it with every chunk. (Stop lets the run end by itself, so its
    # partial reply is exported too; a run cancelled while queued had changed nothing.)
    export = dict(fn=export_conversation, inputs=[chatbot, persona], outputs=tab.widgets.more["export"],
                  queue=False, api_visibility="private")
    for finished in [*tab.run_events, undone, cleared]:
        finished.then(**export)
    gr.on([persona.blur, persona.submit], **export)  # once the persona is typed, not per keystroke


CHAT = TaskView(
    api=TaskAPI(TASKS["dialogue"], "chat",
                (Param("message", str), Param("history", list[list[str]], []), Param("persona", str, "")),
                make_inputs=lambda message, history, persona: DialogueInputs(
                    checked_text("message", message), history_pairs(history), checked_text("persona", persona)),
                description="The bot's reply to message, after history ([user, bot] pairs, oldest first) and a "
                            "persona line. Returns (reply, status line, prompt sent); streams."),
    label="tab_dialogue", run_label="send", build=chat_widgets,
    examples=[["Hello! What is your name?", ""],
              ["Can you tell me a story about a brave mouse?", "Bot is a kind storyteller for children."],
              ["What should I cook for dinner tonight?", "Bot is a friendly chef."]],
    example_inputs=("message", "persona"),
    example_labels=["Hello! What is your name?", "A story about a brave mouse (storyteller)",
                    "What to cook tonight (chef)"],
    from_ui=from_ui, present=show_turn, extras=chat_extras,
)

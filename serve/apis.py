"""What each task takes through the API, by its api_name: its own parameters and how they become
the task's inputs, checked. The Gradio endpoints (ui/), the page's tabs and the replicas of a
deployment (serve/cluster.py) all run these."""
from __future__ import annotations

from typing import Any

from tasks import TASKS, DialogueInputs, GenerateInputs, SummarizeInputs, TranslateInputs

from .limits import brief
from .messages import Refusal
from .running import MAX_CHARS, MAX_CHAT_TURNS, MAX_EXAMPLE_PAIRS, Param, TaskAPI, check_count, check_size, checked_text


def history_pairs(history: Any) -> list[tuple[str, str]]:
    """The API's history, checked: a list of [user, bot] pairs of text, within the limits."""
    is_list = isinstance(history, (list, tuple))
    if is_list:
        check_count("turns in history", len(history), MAX_CHAT_TURNS)  # before its turns are walked
    if not is_list or not all(isinstance(turn, (list, tuple)) and len(turn) == 2
                              and all(isinstance(said, str) for said in turn) for turn in history):
        raise Refusal("history_pairs")
    check_size("history", sum(len(user) + len(bot) for user, bot in history), MAX_CHARS["history"])
    return [(user, bot) for user, bot in history]


def example_pairs(lines: str | None) -> list[tuple[str, str]] | None:
    """The pairs written one `source = target` a line (blank lines skipped); None: the task's
    built-in pairs for the language pair."""
    if lines is None:
        return None
    pairs = []
    for number, line in enumerate(checked_text("examples", lines).splitlines(), start=1):
        if not line.strip():
            continue
        source, equals, target = line.partition("=")
        if not (equals and source.strip() and target.strip()):
            raise Refusal("example_line", number=number, line=brief(line.strip()))
        pairs.append((source.strip(), target.strip()))
    check_count("example pairs", len(pairs), MAX_EXAMPLE_PAIRS)
    return pairs


GENERATE_API = TaskAPI(TASKS["generate"], "generate", (Param("prompt", str),),
                       make_inputs=lambda prompt: GenerateInputs(checked_text("prompt", prompt)),
                       description="Continue the prompt.")
CHAT_API = TaskAPI(TASKS["dialogue"], "chat",
                   (Param("message", str), Param("history", list[list[str]], []), Param("persona", str, "")),
                   make_inputs=lambda message, history, persona: DialogueInputs(
                       checked_text("message", message), history_pairs(history), checked_text("persona", persona)),
                   description="The bot's reply to message, after history ([user, bot] pairs, oldest first) and "
                               "a persona line.")
TRANSLATE_API = TaskAPI(TASKS["translate"], "translate",
                        (Param("text", str), Param("source", str, "English"), Param("target", str, "French"),
                         Param("examples", str | None, None)),
                        make_inputs=lambda text, source, target, examples: TranslateInputs(
                            checked_text("text", text), checked_text("source", source),
                            checked_text("target", target), example_pairs(examples)),
                        description="Translate text by example pairs (GPT-2 paper style). examples: one "
                                    "`source = target` a line; None for the built-in pairs. French <-> German "
                                    "goes through English (the status line gives the English), unless the "
                                    "adapter is off and examples are your own.")
SUMMARIZE_API = TaskAPI(TASKS["summarize"], "summarize", (Param("article", str),),
                        make_inputs=lambda article: SummarizeInputs(checked_text("article", article)),
                        description="Summarise an article with `TL;DR:` (GPT-2 paper style): the first 3 "
                                    "sentences of what follows.")
APIS = {api.name: api for api in (GENERATE_API, CHAT_API, TRANSLATE_API, SUMMARIZE_API)}

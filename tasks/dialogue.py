"""Dialogue: a transcript of speaker-tagged turns that stops at the next speaker tag.

    {persona}
    User: {user}
    Bot: {bot}
    User: {message}
    Bot:
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from engine.generate import SamplingParams
from model.tokenizer import Tokenizer

from .base import Prompt, Task, adapter_completion, first_line, fit_newest, one_line, require_text
from .messages import Message

USER, BOT = "User", "Bot"

# The persona line of each dialogue source the adapter and the pretraining mix learn from (train.data):
# a conversation started with one of these gets the kind of reply that source taught.
PERSONAS = {
    "topicalchat": "Bot is a curious person who likes to chat about fun facts.",
    "sgd": "Bot is a virtual assistant who helps with bookings, travel and everyday tasks.",
    "taskmaster": "Bot takes drink orders at a coffee shop.",
    "chatterbot": "Bot is a friendly chatbot who makes small talk.",
}


@dataclass(frozen=True)
class DialogueInputs:
    message: str
    history: Sequence[tuple[str, str]] = ()  # earlier (user, bot) turns, oldest first
    persona: str = ""  # a line that sets the scene, e.g. "Bot takes drink orders at a coffee shop."


def transcript(inputs: DialogueInputs) -> tuple[str, list[str], str]:
    """The persona line, one part per earlier turn, and the newest message ending in the bot's tag."""
    persona = f"{one_line(inputs.persona)}\n" if inputs.persona.strip() else ""
    turns = [f"{USER}: {one_line(user)}\n{BOT}: {one_line(bot)}\n" for user, bot in inputs.history]
    return persona, turns, f"{USER}: {one_line(inputs.message)}\n{BOT}:"


def fitted_transcript(inputs: DialogueInputs, tokenizer: Tokenizer, max_prompt_tokens: int) -> Prompt:
    """The transcript in at most max_prompt_tokens, its oldest turns dropped to fit (noted); the
    message may still be empty (next_prompt)."""
    persona, turns, newest = transcript(inputs)
    prompt, dropped = fit_newest(tokenizer, max_prompt_tokens, persona, turns, newest,
                                 required="the persona and the message")
    if dropped:
        prompt.notes.append(Message.keyed("dropped_turns" if dropped > 1 else "dropped_turn", count=dropped))
    return prompt


def build_prompt(inputs: DialogueInputs, tokenizer: Tokenizer, max_prompt_tokens: int, adapter_on: bool) -> Prompt:
    # The adapter was trained on this same transcript, so adapter_on changes nothing here.
    require_text(inputs.message, "message")
    return fitted_transcript(inputs, tokenizer, max_prompt_tokens)


def format_example(inputs: DialogueInputs, reply: str) -> tuple[str, str]:
    require_text(inputs.message, "message")
    persona, turns, newest = transcript(inputs)
    return persona + "".join(turns) + newest, adapter_completion(reply)


# Sampled replies could loop ("lifetime lifetime lifetime ...", "and oolongs, and oolongs, ...") or
# ramble past two typical replies; on the validation replies, a 3-gram block and a cap of 36
# tokens (a typical reply is 63 characters, about 16 tokens) stopped both, over five seeds, at
# no cost beyond noise (train.eval's loop rate; docs/app.md).
# A reply is one line of the transcript, as the prompt's turns are: the base model, with no
# adapter to end its turn, wrote on past it in lines that were nobody's turn ("U-seworthy!").
DIALOGUE = Task(
    name="dialogue", title="Dialogue", inputs=DialogueInputs, build_prompt=build_prompt,
    defaults=SamplingParams(temperature=0.8, top_k=40, no_repeat_ngram_size=3, max_new_tokens=36,
                            stop=(f"\n{USER}:", f"\n{BOT}:")),
    postprocess=first_line, adapter="dialogue", format_example=format_example,
)


def next_prompt(inputs: DialogueInputs, tokenizer: Tokenizer, n_ctx: int, max_new_tokens: int) -> Prompt:
    """The prompt the next message goes in, fitted into the context as a run of DIALOGUE fits it,
    with the message as far as it is written (empty, too): what the conversation takes of the
    context before it is sent (the Chat tab's line). Task.prompt's refusals where it cannot fit."""
    drafting = replace(DIALOGUE, build_prompt=lambda inputs, tokenizer, room, adapter_on:
                       fitted_transcript(inputs, tokenizer, room))
    return drafting.prompt(inputs, tokenizer, n_ctx, max_new_tokens, False)

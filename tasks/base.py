"""What a task is, the prompt pieces the tasks share, and `run_task`, which runs one.

A task is data plus small functions (see DESIGN.md): how to build its prompt, its decoding
defaults, how to post-process what the model wrote, and which adapter it switches on.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

from engine.generate import Result, SamplingParams, resolve_seed, stream
from engine.steering import Steering
from model.gpt2 import GPT2
from model.tokenizer import Tokenizer

from .messages import Message, Refusal

# Every adapter completion ends with this, and generation with an adapter on stops at it: an
# adapter answers in one line and has learned to say when it is done.
ADAPTER_END = "\n"

# The notes that say what of the user's input gave way to fit the context: Task.prompt then adds
# why there, where max_new_tokens keeps a large share of the context for the output, since "the
# last 256 of 4,401 tokens" of a 512-token context is a puzzle otherwise. (Where it keeps a small
# share, as Chat's replies do, the note would only repeat itself under every reply.)
GAVE_WAY = {"prompt_cut", "article_cut", "dropped_turn", "dropped_turns", "dropped_examples"}


@dataclass
class Prompt:
    text: str  # what the model is given, as text; a run in two steps (Task.two_steps): both steps' prompts
    ids: list[int]  # what the model is given (the last step's); at most max_prompt_tokens
    notes: list[Message] = field(default_factory=list)  # what had to change to fit the context, for the caller to show


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    inputs: type  # the dataclass of this task's inputs
    build_prompt: Callable[[Any, Tokenizer, int, bool], Prompt]  # (inputs, tokenizer, max_prompt_tokens, adapter_on)
    defaults: SamplingParams  # its stop strings apply whatever the caller's params say
    postprocess: Callable[[str], str]  # generated text -> what the user sees; may cut it
    adapter: str | None = None
    format_example: Callable[[Any, str], tuple[str, str]] | None = None  # (inputs, target) -> adapter training pair
    # For inputs the model does better in two steps (French -> German through English): (inputs, adapter_on)
    # -> (the first step's inputs, its output -> the second step's inputs, the note that says so, which
    # run_task gives the first step's text and counts), or None.
    two_steps: Callable[[Any, bool], tuple[Any, Callable[[str], Any], Message] | None] | None = None

    def stops(self, adapter_on: bool) -> tuple[str, ...]:
        """The stop strings every run of the task has, whatever its params say: its own, and with
        the adapter on, the line end the adapter writes when it is done."""
        return self.defaults.stop + ((ADAPTER_END,) if adapter_on else ())

    def prompt(self, inputs, tokenizer: Tokenizer, n_ctx: int, max_new_tokens: int, adapter_on: bool) -> Prompt:
        """build_prompt in the room that max_new_tokens leaves the prompt (room_to_generate). A
        prompt that cannot fit says what would make it fit: the largest max_new_tokens that
        leaves it room, or (longer than the whole context) only a shorter input."""
        kept_for_output = room_to_generate(n_ctx, max_new_tokens)
        try:
            prompt = self.build_prompt(inputs, tokenizer, n_ctx - kept_for_output, adapter_on)
        except PromptTooLong as error:
            if error.tokens < n_ctx:
                raise Refusal("too_long_shorten", what=error.what, tokens=error.tokens, room=error.room,
                              most=n_ctx - error.tokens) from None
            raise Refusal("too_long_context", what=error.what, tokens=error.tokens, room=error.room,
                          context=n_ctx) from None
        if kept_for_output >= n_ctx // 4 and any(note.key in GAVE_WAY for note in prompt.notes):
            prompt.notes.append(Message.keyed("output_room", reserved=kept_for_output, context=n_ctx))
        return prompt


@dataclass
class TaskUpdate:
    text: str  # all the post-processed text so far: what a UI shows


@dataclass
class TaskDone:
    text: str  # the final post-processed text
    result: Result  # stop_reason "task_done" when post-processing had all it would keep
    prompt: Prompt  # exactly what the model was given


# --- prompt pieces ----------------------------------------------------------------------------

def require_text(text: str, name: str) -> None:
    """Refuse an input field `name` with no text in it."""
    if not isinstance(text, str) or not text.strip():
        raise Refusal("empty", name=name)


def has_letters(text: str) -> bool:
    """Whether the text holds a letter of any script: something that has words to translate."""
    return any(character.isalpha() for character in text)


def one_line(text: str) -> str:
    """Text with each run of whitespace (newlines included) made one space, so that user text
    cannot break a line-based prompt format."""
    return " ".join(text.split())


def adapter_completion(target: str) -> str:
    """What an adapter is trained to write after its prompt: one line, then ADAPTER_END.

    The prompts end in a tag ("TL;DR:", "Bot:", "French:"), after which text starts with a space.
    """
    require_text(target, "target")
    return f" {one_line(target)}{ADAPTER_END}"


class PromptTooLong(ValueError):
    """A prompt whose part that cannot shrink, `what`, needs `tokens` where `room` fit; Task.prompt
    refuses it, saying what would make it fit."""

    def __init__(self, what: str, tokens: int, room: int):
        super().__init__(f"{what}: {tokens:,} tokens, but only {room:,} fit")
        self.what, self.tokens, self.room = what, tokens, room


def cut_between_characters(tokenizer: Tokenizer, ids: Sequence[int], cut: int, step: int) -> int:
    """Where to cut ids (into ids[:cut] and ids[cut:], 1 <= cut < len(ids)) so as not to split a
    character: `cut` moved by step (+1 later, -1 earlier) past tokens that start inside one, so
    that neither side shows U+FFFD, a text the user never wrote. Each side keeps at least one
    token, so a cut held at an end can still split a character (a lone emoji cut to one token)."""
    if not 1 <= cut < len(ids):
        raise ValueError(f"a cut of {len(ids)} tokens must leave one on each side, not cut at {cut}")
    while tokenizer.starts_inside_a_character(ids[cut]) and 1 <= cut + step <= len(ids) - 1:
        cut += step
    return cut


def fit_newest(tokenizer: Tokenizer, max_tokens: int, first: str, parts: list[str], last: str,
               required: str) -> tuple[Prompt, int]:
    """first + as many of the newest (last) parts as fit + last, in at most max_tokens tokens.

    Returns the prompt and how many of the oldest parts it dropped. `first` and `last` are never
    dropped; when they alone do not fit, the error names them as `required`.
    """
    first_ids, last_ids = tokenizer.encode(first), tokenizer.encode(last)
    room = max_tokens - len(first_ids) - len(last_ids)
    if room < 0:
        raise PromptTooLong(required, len(first_ids) + len(last_ids), max_tokens)
    kept_parts, kept_ids = [], []
    for part in reversed(parts):
        ids = tokenizer.encode(part)
        if len(ids) > room:
            break
        room -= len(ids)
        kept_parts.insert(0, part)
        kept_ids[:0] = ids
    # Token ids are joined rather than re-encoded, so the length counted is the length sent.
    prompt = Prompt(first + "".join(kept_parts) + last, first_ids + kept_ids + last_ids)
    return prompt, len(parts) - len(kept_parts)


# --- post-processing --------------------------------------------------------------------------

# A sentence ends at . ! or ? (with any closing quotes or brackets) before whitespace, or at a line
# break. At the very end of the text it may still go on: "3." can become "3.5".
SENTENCE_END = re.compile(r"""[.!?]+["'”’)\]]*(?=\s)|\n""")
TITLES = {"mr", "mrs", "ms", "dr", "prof", "st", "vs"}


def is_abbreviation(before: str) -> bool:
    """Whether a full stop right after `before` closes an abbreviation rather than a sentence:
    a title (Dr.), a dotted abbreviation (e.g., U.S.) or an initial (J.)."""
    word = before.rsplit(None, 1)[-1].lstrip("\"'“‘([") if before.strip() else ""
    return word.lower() in TITLES or "." in word or (len(word) == 1 and word.isupper())


def first_sentences(n: int) -> Callable[[str], str]:
    """A postprocess that keeps the first n sentences (all of the text when it has fewer), stripped."""
    def keep_first_sentences(text: str) -> str:
        start, count = 0, 0
        for end in SENTENCE_END.finditer(text):
            if not text[start:end.start()].strip():
                continue  # a blank line or stray punctuation is not a sentence
            if end.group().startswith(".") and is_abbreviation(text[:end.start()]):
                continue
            start, count = end.end(), count + 1
            if count == n:
                return text[:start].strip()
        return text.strip()
    return keep_first_sentences


def first_line(text: str) -> str:
    """A postprocess that keeps the first line with any text on it, stripped."""
    return next((line.strip() for line in text.split("\n") if line.strip()), "")


def is_final(postprocess: Callable[[str], str], text: str) -> bool:
    """Whether post-processing has cut `text` for good: more text would not change what it keeps.

    The probe is a letter because a space or a full stop could still end a sentence.
    """
    return postprocess(text + "x") == postprocess(text)


# --- running a task ---------------------------------------------------------------------------

class TaskStop(threading.Event):
    """The cancel event `stream` polls once per token. run_task sets it itself once the task has
    all the text it will keep; it also reads as set when the caller's own cancel event is."""

    def __init__(self, cancel: threading.Event | None):
        super().__init__()
        self.cancel = cancel

    @property
    def task_done(self) -> bool:
        return super().is_set()

    def is_set(self) -> bool:
        return self.task_done or (self.cancel is not None and self.cancel.is_set())


def room_to_generate(n_ctx: int, max_new_tokens: int) -> int:
    """The context tokens a task's prompt leaves for generation: max_new_tokens, but at most half
    the context, so that any max_new_tokens (the sliders reach 512, the bundled model's whole
    context) leaves the prompt room; a longer generation stops when the context is full, and
    says so ("context_full")."""
    return min(max_new_tokens, n_ctx // 2)


def run_task(task: Task, model: GPT2, tokenizer: Tokenizer, inputs, params: SamplingParams,
             adapter_on: bool = False, cancel: threading.Event | None = None,
             forced: Sequence[int] = (), steering: Steering | None = None) -> Iterator[TaskUpdate | TaskDone]:
    """Build the task's prompt, generate with its stop strings, and stream the post-processed text:
    a TaskUpdate whenever what the user sees changes, then one TaskDone.

    Generation stops early once post-processing has all it will keep (e.g. 3 whole sentences).
    `forced` tokens come first, as if the model had drawn them (continuing from a chosen
    alternative): they count in max_new_tokens, in the Result's generated tokens and in the
    presence and frequency penalties, as in the run they come from, but the Result's token_ids are
    the ones drawn after them; forced tokens
    that already fill max_new_tokens (the run's last token, replaced) draw none. `steering` is
    added to the residual stream of every step (engine/steering.py).
    """
    if not isinstance(inputs, task.inputs):
        raise TypeError(f"the {task.name} task takes {task.inputs.__name__}, got {type(inputs).__name__}")
    steps = task.two_steps(inputs, adapter_on) if task.two_steps is not None else None
    if steps is not None:
        yield from run_in_two_steps(task, model, tokenizer, steps, params, adapter_on, cancel, forced, steering)
        return
    prompt = task.prompt(inputs, tokenizer, model.config.n_positions, params.max_new_tokens, adapter_on)
    params = replace(params, stop=tuple(dict.fromkeys(task.stops(adapter_on) + params.stop)))
    if adapter_on and task.adapter is None:
        raise Refusal("no_task_adapter", task=task.name)
    start = tokenizer.decode(list(forced)) if forced else ""
    if len(forced) >= params.max_new_tokens:
        result = Result("", resolve_seed(params.seed), len(prompt.ids), len(forced), 0.0, "max_tokens")
        yield TaskDone(task.postprocess(start), result, prompt)
        return
    params = replace(params, max_new_tokens=params.max_new_tokens - len(forced),
                     min_new_tokens=max(0, params.min_new_tokens - len(forced)))
    stop = TaskStop(cancel)
    shown, result = "", None
    text = start
    for event in stream(model, tokenizer, prompt.ids + list(forced), params, stop,
                        adapter=task.adapter if adapter_on else None, steering=steering, drawn_before=len(forced)):
        if isinstance(event, Result):
            result = event
            continue
        text += event.text
        kept = task.postprocess(text)
        if kept != shown:
            shown = kept
            yield TaskUpdate(kept)
        if is_final(task.postprocess, text):
            stop.set()
    # stream reports our own early stop as "cancelled"; say what really happened.
    if stop.task_done and not (cancel is not None and cancel.is_set()):
        result = replace(result, stop_reason="task_done")
    if forced:
        result = replace(result, prompt_tokens=len(prompt.ids), generated_tokens=len(forced) + result.generated_tokens)
    yield TaskDone(task.postprocess(start + result.text), result, prompt)


def run_in_two_steps(task: Task, model: GPT2, tokenizer: Tokenizer, steps, params: SamplingParams,
                     adapter_on: bool, cancel: threading.Event | None, forced: Sequence[int],
                     steering: Steering | None = None):
    """run_task through Task.two_steps: the first step's output, not shown, is the second step's
    input; both steps draw with the run's one seed, and the Result is the second step's (the
    status line's counts and speed are the step the user sees), its note naming the first's
    output and counts. Both steps are steered alike."""
    first_inputs, second_inputs, note = steps
    params = replace(params, seed=resolve_seed(params.seed))
    first = next(event for event in run_task(task, model, tokenizer, first_inputs, params, adapter_on, cancel,
                                             steering=steering)
                 if isinstance(event, TaskDone))
    counts = dict(prompt=first.result.prompt_tokens, generated=first.result.generated_tokens)
    # Nothing to go on with (the second step would refuse an English with no letters as the user's text)
    if first.result.stop_reason == "cancelled" or not has_letters(first.text):
        yield TaskDone("", first.result, Prompt(first.prompt.text, first.prompt.ids,
                                                [*first.prompt.notes, note.with_fields(text="(nothing)", **counts)]))
        return
    text, cut_notes = fit_for_second_step(task, tokenizer, model.config.n_positions, params.max_new_tokens,
                                          adapter_on, second_inputs, first.text)
    for event in run_task(task, model, tokenizer, second_inputs(text), params, adapter_on, cancel, forced, steering):
        if isinstance(event, TaskDone):
            # a note both steps make (no example pairs sent) is said once
            later = [n for n in event.prompt.notes if n not in first.prompt.notes]
            event.prompt = Prompt(f"{first.prompt.text}\n\n{event.prompt.text}", event.prompt.ids,
                                  [*first.prompt.notes, note.with_fields(text=text, **counts), *cut_notes, *later])
        yield event


def fit_for_second_step(task: Task, tokenizer: Tokenizer, n_ctx: int, max_new_tokens: int, adapter_on: bool,
                        second_inputs, text: str) -> tuple[str, list[Message]]:
    """The first step's output, cut at its end to what the second step's prompt leaves it room for,
    and the note that says so (none when it fits whole). Where even one token of it leaves no room
    (a context far smaller than any model's), the second step's refusal stands.

    The first step may write more than the second step's prompt has room for (a sentence that
    never ends, up to max_new_tokens); its text is the app's, not the user's, so it is cut rather
    than refused as too long. Its tokens are counted as the second step reads them (the text
    encoded again), which may differ from the first step's generated count."""
    room = n_ctx - room_to_generate(n_ctx, max_new_tokens)
    ids = tokenizer.encode(text)
    kept = ids
    while True:
        try:
            task.build_prompt(second_inputs(text), tokenizer, room, adapter_on)
        except PromptTooLong as error:
            excess = error.tokens - room
            if excess <= 0 or len(kept) - excess < 1:
                raise  # not the text's length: nothing a cut can mend
            kept = kept[:cut_between_characters(tokenizer, kept, len(kept) - excess, -1)]
            text = tokenizer.decode(kept)
            continue
        was_cut = len(kept) < len(ids)
        return text, [Message.keyed("first_step_cut", kept=len(kept), tokens=len(ids))] if was_cut else []

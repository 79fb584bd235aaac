"""Translation prompting as in the GPT-2 paper: example pairs `source = target`, one per line, then
`text =`, decoded greedily (with a mild repetition penalty, which stops loops); the first sentence is
the translation.

The pairs are all that tells the model which languages it is translating between. The built-in
ones do; no pairs, or a few of the user's own (`dog = Hund`), mostly did not: the bundled model
answered English -> German in French. So such a prompt starts with a line that names the two
languages, each in itself, in the pairs' own format (`English = Deutsch`, languages_line).

The adapter was trained zero-shot with language tags instead: `English: {text}\nFrench:`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.generate import SamplingParams
from model.tokenizer import Tokenizer

from .base import Prompt, Task, adapter_completion, first_sentences, fit_newest, has_letters, one_line, require_text
from .messages import Message, Refusal

LANGUAGES = ("English", "French", "German")
# Short everyday sentences written for this app, one column per language of LANGUAGES.
PHRASES = [
    ("I would like a cup of coffee.", "Je voudrais une tasse de café.", "Ich hätte gern eine Tasse Kaffee."),
    ("The weather is nice today.", "Il fait beau aujourd'hui.", "Das Wetter ist heute schön."),
    ("My brother lives in a small town.", "Mon frère habite dans une petite ville.",
     "Mein Bruder wohnt in einer kleinen Stadt."),
    ("We are reading a book in the garden.", "Nous lisons un livre dans le jardin.", "Wir lesen ein Buch im Garten."),
]
# Each language's name in itself, for the line that names a prompt's two languages. A line in the
# pairs' own format, since the base model learnt translation from pairs alone: the adapter's tags
# or an instruction ("Translate English to German:") did not move it (docs/translation.md).
NATIVE_NAMES = {"English": "English", "French": "français", "German": "Deutsch"}
DEFAULT_EXAMPLES = {
    (source, target): [(row[i], row[j]) for row in PHRASES]
    for i, source in enumerate(LANGUAGES) for j, target in enumerate(LANGUAGES) if i != j
}


@dataclass(frozen=True)
class TranslateInputs:
    text: str
    source: str = "English"
    target: str = "French"
    examples: Sequence[tuple[str, str]] | None = None  # (source, target) pairs; None: DEFAULT_EXAMPLES


def own_examples(inputs: TranslateInputs) -> bool:
    """Whether the inputs send example pairs other than the built-in ones: none at all included."""
    return inputs.examples is not None and \
        [tuple(pair) for pair in inputs.examples] != DEFAULT_EXAMPLES.get((inputs.source, inputs.target))


def languages_line(source: str, target: str) -> str:
    """`English = Deutsch`: a first line that tells the model which way to translate, in the one
    format it learnt translation in."""
    return f"{NATIVE_NAMES[source]} = {NATIVE_NAMES[target]}\n"


def prompt_parts(inputs: TranslateInputs, adapter_on: bool, sentences: int | None = None) -> tuple[str, list[str], str]:
    """The line that names the two languages (where the pairs may not show them: no pairs or the
    user's own; otherwise empty), the example lines, and the final line that asks for the
    translation of the text: of its first `sentences` (None: all of it, as a training pair)."""
    require_text(inputs.text, "text to translate")
    # Symbols alone ("@@@ ###") have no words to translate, yet the model would answer with a
    # confident sentence: said instead.
    if not has_letters(inputs.text):
        raise Refusal("no_letters")
    if (inputs.source, inputs.target) not in DEFAULT_EXAMPLES:
        raise Refusal("languages", source=inputs.source, target=inputs.target, languages=", ".join(LANGUAGES))
    text = one_line(inputs.text) if sentences is None else first_sentences(sentences)(one_line(inputs.text))
    if adapter_on:
        return "", [], f"{inputs.source}: {text}\n{inputs.target}:"
    own = own_examples(inputs)
    examples = inputs.examples if own else DEFAULT_EXAMPLES[inputs.source, inputs.target]
    first = languages_line(inputs.source, inputs.target) if own else ""
    return first, [f"{one_line(source)} = {one_line(target)}\n" for source, target in examples], f"{text} ="


# The line that names the languages makes the target likely, not sure.
NO_EXAMPLES = Message.keyed("no_examples")
# The model reads the first sentence only, and its translation is cut at its first sentence
# (TRANSLATE's postprocess), as it learnt them: said, so that a paragraph's missing rest is not a
# surprise. (Sent whole, the model could translate another sentence than the first.)
FIRST_SENTENCE_ONLY = Message.keyed("first_sentence_only")


def build_prompt(inputs: TranslateInputs, tokenizer: Tokenizer, max_prompt_tokens: int, adapter_on: bool) -> Prompt:
    first, examples, query = prompt_parts(inputs, adapter_on, sentences=1)
    prompt, dropped = fit_newest(tokenizer, max_prompt_tokens, first, examples, query, required="the text to translate")
    if dropped:
        prompt.notes.append(Message.keyed("dropped_examples", count=dropped, total=len(examples)))
    text = one_line(inputs.text)
    if first_sentences(1)(text) != text:
        prompt.notes.append(FIRST_SENTENCE_ONLY)
    if not adapter_on and not examples:  # an emptied box: said, since only the first line then names the languages
        prompt.notes.append(NO_EXAMPLES)
    return prompt


PIVOT = "English"  # the language every translation the bundled model learnt starts or ends in


def goes_through_english(source: str, target: str) -> bool:
    """Whether the pair is French <-> German, which the bundled model translates in two steps."""
    return PIVOT not in (source, target) and (source, target) in DEFAULT_EXAMPLES


def through_english(inputs: TranslateInputs, adapter_on: bool):
    """French <-> German in two steps, through English (Task.two_steps): the adapter learnt only
    English <-> French and English <-> German, and the base model's direct French = German lines
    came out in English or half in each. Not with example pairs of the user's own: those are the
    user's way to ask for the direct translation. An emptied box is not: sent direct, French ->
    German came out in English, so it goes through English too, each step without pairs."""
    emptied = inputs.examples is not None and not inputs.examples
    asks_direct = own_examples(inputs) and not emptied and not adapter_on
    if not goes_through_english(inputs.source, inputs.target) or asks_direct:
        return None  # one step; a pair that is no translation is refused there, as asked
    pairs = [] if emptied else None
    return (TranslateInputs(inputs.text, inputs.source, PIVOT, pairs),
            lambda english: TranslateInputs(english, PIVOT, inputs.target, pairs),
            # the status line's counts are the second step's: the note gives the first's
            Message.keyed("translated_through", language=PIVOT))


def format_example(inputs: TranslateInputs, translation: str) -> tuple[str, str]:
    _, _, query = prompt_parts(inputs, adapter_on=True)
    return query, adapter_completion(translation)


# Greedy decoding can loop ("Où est la train de train de train de ..." to max_new_tokens), and
# neither the first-sentence cut nor the newline stop ends a loop. A mild repetition penalty stops
# it at no cost beyond noise; a no-repeat n-gram block would also forbid the n-grams of the example
# pairs and of the text itself, which a translation must repeat (docs/translation.md).
TRANSLATE = Task(
    name="translate", title="Translate", inputs=TranslateInputs, build_prompt=build_prompt,
    defaults=SamplingParams(temperature=0.0, repetition_penalty=1.15, max_new_tokens=64, stop=("\n",)),
    postprocess=first_sentences(1), adapter="translate", format_example=format_example, two_steps=through_english,
)

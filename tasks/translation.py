"""Translation prompting as in the GPT-2 paper: example pairs `source = target`, one per line, then
`text =`, decoded greedily; the first sentence is the translation.

The adapter was trained zero-shot with language tags instead: `English: {text}\nFrench:`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.generate import SamplingParams
from model.tokenizer import Tokenizer

from .base import Prompt, Task, adapter_completion, first_sentences, fit_newest, one_line, require_text

LANGUAGES = ("English", "French", "German")
# Short everyday sentences written for this app, one column per language of LANGUAGES.
PHRASES = [
    ("I would like a cup of coffee.", "Je voudrais une tasse de café.", "Ich hätte gern eine Tasse Kaffee."),
    ("The weather is nice today.", "Il fait beau aujourd'hui.", "Das Wetter ist heute schön."),
    ("My brother lives in a small town.", "Mon frère habite dans une petite ville.",
     "Mein Bruder wohnt in einer kleinen Stadt."),
    ("We are reading a book in the garden.", "Nous lisons un livre dans le jardin.", "Wir lesen ein Buch im Garten."),
]
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


def prompt_parts(inputs: TranslateInputs, adapter_on: bool) -> tuple[list[str], str]:
    """The example lines and the final line that asks for the translation."""
    require_text(inputs.text, "text to translate is empty")
    if (inputs.source, inputs.target) not in DEFAULT_EXAMPLES:
        raise ValueError(f"cannot translate {inputs.source} to {inputs.target}: source and target must be two "
                         f"different languages of {', '.join(LANGUAGES)}")
    text = one_line(inputs.text)
    if adapter_on:
        return [], f"{inputs.source}: {text}\n{inputs.target}:"
    examples = DEFAULT_EXAMPLES[inputs.source, inputs.target] if inputs.examples is None else inputs.examples
    return [f"{one_line(source)} = {one_line(target)}\n" for source, target in examples], f"{text} ="


def build_prompt(inputs: TranslateInputs, tokenizer: Tokenizer, max_prompt_tokens: int, adapter_on: bool) -> Prompt:
    examples, query = prompt_parts(inputs, adapter_on)
    prompt, dropped = fit_newest(tokenizer, max_prompt_tokens, "", examples, query, required="the text to translate")
    if dropped:
        prompt.notes.append(f"dropped {dropped:,} of the {len(examples):,} examples to fit the context")
    if not adapter_on and not examples:  # an emptied box: said, since the model is then given no language
        prompt.notes.append("no example pairs sent: the model sees the text alone")
    return prompt


PIVOT = "English"  # the language every translation the bundled model learnt starts or ends in


def goes_through_english(source: str, target: str) -> bool:
    """Whether the pair is French <-> German, which the bundled model translates in two steps."""
    return PIVOT not in (source, target) and (source, target) in DEFAULT_EXAMPLES


def through_english(inputs: TranslateInputs, adapter_on: bool):
    """French <-> German in two steps, through English (Task.two_steps): the adapter learnt only
    English <-> French and English <-> German, and the base model's direct French = German lines
    came out in English or half in each. Not with example pairs of the user's own: those are the
    user's way to ask for the direct translation."""
    own_examples = inputs.examples is not None and [tuple(pair) for pair in inputs.examples] != \
        DEFAULT_EXAMPLES.get((inputs.source, inputs.target))
    if not goes_through_english(inputs.source, inputs.target) or (own_examples and not adapter_on):
        return None  # one step; a pair that is no translation is refused there, as asked
    return (TranslateInputs(inputs.text, inputs.source, PIVOT),
            lambda english: TranslateInputs(english, PIVOT, inputs.target),
            # ui.messages: translated_through; the status line's counts are the second step's
            f"translated through {PIVOT} (first step: {{prompt}} prompt + {{generated}} generated tokens): {{text}}")


def format_example(inputs: TranslateInputs, translation: str) -> tuple[str, str]:
    _, query = prompt_parts(inputs, adapter_on=True)
    return query, adapter_completion(translation)


TRANSLATE = Task(
    name="translate", title="Translate", inputs=TranslateInputs, build_prompt=build_prompt,
    defaults=SamplingParams(temperature=0.0, max_new_tokens=64, stop=("\n",)),
    postprocess=first_sentences(1), adapter="translate", format_example=format_example, two_steps=through_english,
)

"""Summarisation as in the GPT-2 paper: the article, then `TL;DR:`; 100 tokens sampled with top-k 2,
of which the first 3 sentences of the first line are the summary, with no 4-gram repeated. The
adapter was trained on this same format."""
from __future__ import annotations

from dataclasses import dataclass

from engine.generate import SamplingParams
from model.tokenizer import Tokenizer

from .base import (Prompt, PromptTooLong, Task, adapter_completion, cut_between_characters, first_sentences,
                   has_letters, require_text)
from .messages import Message, Refusal

TLDR = "\nTL;DR:"


@dataclass(frozen=True)
class SummarizeInputs:
    article: str


def build_prompt(inputs: SummarizeInputs, tokenizer: Tokenizer, max_prompt_tokens: int, adapter_on: bool) -> Prompt:
    require_text(inputs.article, "article")
    # Symbols or emoji alone have nothing to summarise, yet the model would write a summary of
    # something else: said instead.
    if not has_letters(inputs.article):
        raise Refusal("no_letters_article")
    article_ids, suffix_ids = tokenizer.encode(inputs.article.strip()), tokenizer.encode(TLDR)
    # Without TL;DR: the model does not know to summarise, so a long article gives way, from its end.
    room = max_prompt_tokens - len(suffix_ids)
    if room < 1:
        raise PromptTooLong("TL;DR: and one token of the article", len(suffix_ids) + 1, max_prompt_tokens)
    notes = []
    if len(article_ids) > room:
        end = cut_between_characters(tokenizer, article_ids, room, -1)
        notes.append(Message.keyed("article_cut", room=end, tokens=len(article_ids)))
        article_ids = article_ids[:end]
    return Prompt(tokenizer.decode(article_ids) + TLDR, article_ids + suffix_ids, notes)


def format_example(inputs: SummarizeInputs, summary: str) -> tuple[str, str]:
    require_text(inputs.article, "article")
    return inputs.article.strip() + TLDR, adapter_completion(summary)


# A 4-gram block stops the repeats seen in sampled lessons ("The best is the best is the best is ...");
# a 3-gram block cost the derived summaries ROUGE on validation, since it also forbids the
# article's own 3-grams, which a summary copies. The summary is the first line, as the adapter
# learnt it: without the adapter the model could go on into a story or a transcript on the next
# lines. Both chosen on the validation summaries, over 15 seeds (train.eval's loop rate; docs/app.md).
SUMMARIZE = Task(
    name="summarize", title="Summarise", inputs=SummarizeInputs, build_prompt=build_prompt,
    defaults=SamplingParams(top_k=2, no_repeat_ngram_size=4, max_new_tokens=100, stop=("\n",)),
    postprocess=first_sentences(3), adapter="summarize", format_example=format_example,
)

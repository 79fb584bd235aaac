"""What a score is worth: answers with no model in them, scored on the same test items as the model.

- Translation: copying the source unchanged, and the translation of the nearest training source
  in the same direction (character trigrams, cosine similarity): Tatoeba is full of near-paraphrases,
  so a lookup scores close to the model on everyday lines.
- Summaries: the best constant answer (the one training summary that scores highest, by ROUGE-L,
  against the other training summaries of its kind) and the text's last sentence.
- Dialogue: the base model with the task's prompt alone, the evaluation's own "base" column.

Everything is computed from the splits it is given, so a change to a split moves its baseline.
Also here: how similar a sentence is to its nearest training source (the generalisation set keeps
those far from all of them), and whether an output loops.
"""
from __future__ import annotations

import functools
import re
import warnings
from collections import Counter

import torch
from rouge_score import rouge_scorer, tokenizers

from tasks.translation import PIVOT

CHUNK = 256  # queries scored against the whole index at once
MAX_CONSTANT_CANDIDATES = 300  # training summaries tried as the constant answer (a fixed sample beyond)


def trigrams(text: str) -> set[str]:
    """The text's character trigrams, lower-cased, with a space at each end (so that a word's
    first and last letters count)."""
    padded = f" {' '.join(text.lower().split())} "
    return {padded[i:i + 3] for i in range(len(padded) - 2)}


class TrigramIndex:
    """Texts by their character trigrams, to find each query's most similar text (cosine of the
    trigram sets) as one sparse product."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.vocabulary: dict[str, int] = {}
        rows, columns, values = [], [], []
        for row, text in enumerate(texts):
            grams = trigrams(text)
            for gram in grams:
                rows.append(row)
                columns.append(self.vocabulary.setdefault(gram, len(self.vocabulary)))
                values.append(len(grams) ** -0.5)
        with warnings.catch_warnings():  # PyTorch calls its sparse CSR tensors beta: this product is all we use
            warnings.simplefilter("ignore", UserWarning)
            self.matrix = torch.sparse_coo_tensor([rows, columns], values, (len(texts), len(self.vocabulary)),
                                                  dtype=torch.float32).to_sparse_csr()

    def nearest(self, queries: list[str]) -> list[tuple[int, float]]:
        """For each query, the index of its most similar text and their similarity (0 to 1)."""
        found = []
        for start in range(0, len(queries), CHUNK):
            chunk = queries[start:start + CHUNK]
            dense = torch.zeros(len(self.vocabulary), len(chunk))
            for column, query in enumerate(chunk):
                grams = trigrams(query)
                known = [self.vocabulary[g] for g in grams if g in self.vocabulary]
                dense[known, column] = len(grams) ** -0.5  # the query's unknown trigrams still count in its norm
            best, where = (self.matrix @ dense).max(dim=0)
            found += list(zip(where.tolist(), best.tolist()))
        return found


class TranslationLookup:
    """The training pairs, indexed by their sources once for all the lookups of a run: per
    direction for the nearest training pair, and all directions together for how near a
    sentence comes to anything trained on."""

    def __init__(self, train: list[dict]):
        self.train = train
        self.indexes: dict[tuple[str, str] | None, tuple[TrigramIndex | None, list[dict]]] = {}

    def index(self, direction: tuple[str, str] | None) -> tuple[TrigramIndex | None, list[dict]]:
        """The index of one direction's training sources (None: every distinct source), and its
        pairs; no index where there are none."""
        if direction not in self.indexes:
            if direction is None:
                pairs = [{"text": text} for text in sorted({r["text"] for r in self.train})]
            else:
                pairs = [r for r in self.train if (r["source"], r["target"]) == direction]
            self.indexes[direction] = TrigramIndex([r["text"] for r in pairs]) if pairs else None, pairs
        return self.indexes[direction]

    def translations(self, texts: list[str], source: str, target: str) -> list[str]:
        """For each text, the translation of the training pair whose source is nearest in that
        direction; for a direction with no training pairs (French <-> German), looked up through
        English, as the Translate tab translates it."""
        index, pairs = self.index((source, target))
        if pairs:
            return [pairs[j]["translation"] for j, _ in index.nearest(texts)]
        if PIVOT in (source, target):
            return [""] * len(texts)
        return self.translations(self.translations(texts, source, PIVOT), PIVOT, target)

    def similarity(self, texts: list[str]) -> list[float]:
        """How similar each text is to the nearest training source of any direction."""
        index, _ = self.index(None)
        return [similarity for _, similarity in index.nearest(texts)] if index else [0.0] * len(texts)


def translation_baselines(lookup: TranslationLookup, test: list[dict]) -> dict[str, list[str]]:
    """Each baseline's output for each test record: the source itself, and the translation of the
    training pair whose source is nearest, in the same direction."""
    nearest = [""] * len(test)
    for source, target in {(r["source"], r["target"]) for r in test}:
        chosen = [i for i, r in enumerate(test) if (r["source"], r["target"]) == (source, target)]
        for i, translation in zip(chosen, lookup.translations([test[i]["text"] for i in chosen], source, target)):
            nearest[i] = translation
    return {"copy the source": [r["text"] for r in test], "nearest training pair": nearest}


class OnceTokenizer(tokenizers.Tokenizer):
    """rouge_score's own tokenizer (lowercased, Porter-stemmed words), each text tokenized once:
    choosing the constant answer scores hundreds of candidates against the same references, and
    stemming was nearly all of its time when each pair stemmed its texts again."""
    def __init__(self):
        self.stemmed = functools.lru_cache(maxsize=1 << 16)(tokenizers.DefaultTokenizer(use_stemmer=True).tokenize)

    def tokenize(self, text: str) -> list[str]:
        return self.stemmed(text)


ROUGE = rouge_scorer.RougeScorer(["rougeL"], tokenizer=OnceTokenizer())


def best_constant(summaries: list[str]) -> str:
    """The training summary with the highest mean ROUGE-L F1 against the training summaries."""
    candidates = sorted(set(summaries))
    if len(candidates) > MAX_CONSTANT_CANDIDATES:  # a fixed sample, by text, not by chance
        candidates = candidates[::len(candidates) // MAX_CONSTANT_CANDIDATES + 1]
    references = summaries[:MAX_CONSTANT_CANDIDATES * 2]

    def mean_score(candidate: str) -> float:
        return sum(ROUGE.score(reference, candidate)["rougeL"].fmeasure for reference in references)
    return max(candidates, key=mean_score)


SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def last_sentence(text: str) -> str:
    sentences = [s.strip() for s in SENTENCE_END.split(text.strip()) if s.strip()]
    return sentences[-1] if sentences else ""


def summary_baselines(train: list[dict], test: list[dict]) -> dict[str, list[str]]:
    """Each baseline's output for each test record: the best constant answer, chosen on the
    training summaries of the test records' own source (fables, or derived ones), and the text's
    last sentence."""
    sources = {r.get("source") for r in test}
    constant = best_constant([r["summary"] for r in train if r.get("source") in sources])
    return {"best constant answer": [constant] * len(test),
            "last sentence": [last_sentence(r["article"]) for r in test]}


def typical_length(references: list[str]) -> int:
    """The median length, in characters, of a task's training references: how long an answer of
    its kind usually is."""
    lengths = sorted(len(reference) for reference in references)
    return lengths[len(lengths) // 2] if lengths else 0


def loops(output: str, reference: str, typical: int = 0) -> bool:
    """Whether an output repeats without end: a word 3-gram three times or more, or an output
    over 2.5 times its reference's length. A reference shorter than its task's typical answer
    (typical_length) counts as that long: a chat reply of one ordinary sentence to a quiz whose
    answer is "Paris" runs longer than the answer, not on without end."""
    words = output.lower().split()
    repeated = Counter(zip(words, words[1:], words[2:]))
    return bool(repeated) and max(repeated.values()) >= 3 or len(output) > 2.5 * max(len(reference), typical, 1)

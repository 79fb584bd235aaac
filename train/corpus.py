"""The project's training text: where it lives, how it is cleaned and split.

Everything is read from `<repo root>/../shared/data` (override with the
environment variable STUDIO_DATA_DIR); nothing is copied into the repository.

Decisions, and why:

Gutenberg (45 children's classics, one document per book)
- Only the text between the `*** START OF` and `*** END OF` lines is kept;
  two old-style files (Heidi, Five Children and It) mark the same places with
  `*END*THE SMALL PRINT` and `End of the Project Gutenberg Etext` (or
  `*Project Gutenberg Etext of`) lines.
- Lines are hard-wrapped at ~70 characters. A line of 55+ characters followed
  by an unindented line is joined to it, so a paragraph becomes one line as in
  TinyStories; otherwise the model learns to emit a newline every 70
  characters. Short lines (verse, headings) and indented lines are kept.
- Validation holds out two whole books, VAL_BOOKS (2.4% of the Gutenberg
  text). Whole books rather than the tail of every book: a held-out tail
  shares its characters and plot with the training part, so its loss would
  flatter the model. Both books have siblings in training (the Oz series,
  fairy tales), so the held-out text is still in-distribution.

TinyStories (one document per story)
- Paragraphs are separated by a blank line and stories by a plain newline.
- The normal-cased file (ajaykumar) is used as is, except for its last 10%
  of stories, held out for validation.
- The lowercased file (arnoochka) starts with the same stories as the
  ajaykumar file: every story that equals a lowercased ajaykumar story is
  skipped (this removes the first ~22%, validation stories included). The
  rest (4,386 stories, 3.2 MB) would teach the model to write in lowercase,
  so its casing is restored by a truecaser learned from the normal-cased
  TinyStories training stories: a word takes its most frequent casing seen
  mid-sentence, a sentence start is capitalised, a word right after a
  quotation that ends a sentence (`"Hi!" said Tom` vs `"Hi!" She smiled`)
  takes its most frequent casing in that position, and the word after
  "named" is a name throughout its story ("a dog named spot"). Gutenberg's
  casing is not used: adding it lowered word accuracy from 99.55% to 99.34%
  (it capitalises King, Queen, and animal characters such as Lion).
  `measure_truecasing()` scores the truecaser on the held-out ajaykumar
  stories (lowercase them, restore, compare words): 99.55% of words and
  98.3% of capitalised words come back right. `python -m train.corpus`
  prints these numbers for the model card.
- All three files contain UTF-8 decoded as Windows-1252 (`â€œ` for `“`);
  the few sequences that occur are mapped back (MOJIBAKE).
- `yuninxia_tinystories_val.txt` is the TinyStories validation split and is
  never training text: it is only exposed by tinystories_validation_text(),
  for bits-per-byte evaluation (with the same mojibake repair).

Task data (Tatoeba eng-fra and eng-deu, dialogue, Aesop) is read here; its training splits, the
only part any training sees (the tokenizer's included), are cut by train/data.py.
"""

import functools
import os
import re
from collections import Counter, defaultdict
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Iterator, Literal, Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("STUDIO_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))

GUTENBERG_DIR = DATA_DIR / "pretrain" / "gutenberg"
TINYSTORIES_DIR = DATA_DIR / "pretrain" / "tinystories"
VAL_BOOKS = ("Tik-Tok-of-Oz_956", "The-Happy-Prince-and-Other-Tales_902")
TINYSTORIES_VAL_FRACTION = 0.1

# Every mis-decoded sequence found in the TinyStories files. The bare "â€" (a
# closing quote whose last byte was lost) is a prefix of others: it goes last.
# The lowercased file has "â"/"ã" where the original had "Â"/"Ã".
MOJIBAKE = {
    "â€œ": "“", "â€™": "’", "â€˜": "‘", "â€“": "–", "â€”": "—", "â€¦": "…",
    "â€Š": "\u200a", "â«": "«", "â»": "»", "â¡": "¡",
    "ã±": "ñ", "ã©": "é", "ã¡": "á", "ã³": "ó", "â€": "”",
}
_MOJIBAKE_PATTERN = re.compile("|".join(map(re.escape, MOJIBAKE)))


def read_text(path: Path) -> str:
    """A UTF-8 text file with "\\n" line ends."""
    if not path.is_file():
        raise FileNotFoundError(
            f"data file {path} not found (data directory: {DATA_DIR}; "
            "set STUDIO_DATA_DIR to point elsewhere)")
    return path.read_text(encoding="utf-8").replace("\r\n", "\n")


# ----------------------------------------------------------------------------
# Gutenberg

_BODY_START = re.compile(r"^\*\*\* ?START OF|^\*END\*? ?THE SMALL PRINT", re.M)
_BODY_END = re.compile(r"^\*\*\* ?END OF|^End of (the )?Project Gutenberg|^\*Project Gutenberg Etext", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """The book between the Project Gutenberg header and footer lines."""
    start = _BODY_START.search(text)
    if start is None:
        raise ValueError("no '*** START OF' line: not a Project Gutenberg text?")
    body_start = text.find("\n", start.end()) + 1
    end = _BODY_END.search(text, body_start)
    if end is None:
        raise ValueError("no '*** END OF' line: not a Project Gutenberg text?")
    return text[body_start:end.start()].strip() + "\n"


def unwrap_lines(text: str, min_wrapped_length: int = 55) -> str:
    """Join hard-wrapped lines: a long line followed by an unindented one."""
    lines = text.split("\n")
    joined = [lines[0]]
    for previous, line in zip(lines, lines[1:]):
        if len(previous.rstrip()) >= min_wrapped_length and line[:1].strip():
            joined[-1] = joined[-1].rstrip() + " " + line
        else:
            joined.append(line)
    return "\n".join(joined)


@functools.cache
def gutenberg_books() -> Mapping[str, str]:
    """Book name (file stem) -> cleaned text, for all 45 books (read-only)."""
    paths = sorted(GUTENBERG_DIR.glob("*.txt"))
    if not paths:
        raise FileNotFoundError(f"no Gutenberg books (*.txt) in {GUTENBERG_DIR}")
    books = {}
    for path in paths:
        try:
            books[path.stem] = unwrap_lines(strip_gutenberg(read_text(path)))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    return MappingProxyType(books)


# ----------------------------------------------------------------------------
# TinyStories


def fix_mojibake(text: str) -> str:
    return _MOJIBAKE_PATTERN.sub(lambda match: MOJIBAKE[match.group()], text)


def split_stories(text: str) -> list[str]:
    """A story starts at a non-blank line directly after a non-blank line."""
    stories, lines = [], []
    for line in text.split("\n"):
        if line.strip() and lines and lines[-1].strip():
            stories.append("\n".join(lines).strip())
            lines = []
        lines.append(line)
    stories.append("\n".join(lines).strip())
    return [story for story in stories if story]


@functools.cache
def cased_stories() -> tuple[str, ...]:
    """TinyStories with their original casing (ajaykumar), mojibake left in."""
    return tuple(split_stories(read_text(TINYSTORIES_DIR / "ajaykumar_tiny_stories.txt")))


@functools.cache
def lowercase_only_stories() -> tuple[str, ...]:
    """The arnoochka stories that are not lowercased copies of ajaykumar ones."""
    known = {story.lower() for story in cased_stories()}
    stories = split_stories(read_text(TINYSTORIES_DIR / "arnoochka_tinystories.txt"))
    return tuple(story for story in stories if story not in known)


def tinystories_validation_text() -> str:
    """The TinyStories validation split, for bits-per-byte evaluation only."""
    return fix_mojibake(read_text(TINYSTORIES_DIR / "yuninxia_tinystories_val.txt"))


# ----------------------------------------------------------------------------
# Truecasing

# Words, ends of sentences (maybe closed by a quote), opening quotes, newlines.
_CASING_TOKENS = re.compile(r"""
    (?P<word>[^\W\d_]+)
  | (?P<stop>[.!?]+)(?P<closing>["'”’]*)
  | (?P<opening>(?<!\S)["'“‘])
  | (?P<newline>\n)
""", re.X)
SENTENCE_START, AFTER_QUOTE, MID_SENTENCE = "start", "after_quote", "mid"


def _words_in_context(text: str) -> Iterator[tuple[re.Match, str]]:
    """Each word of `text` with its position in the sentence."""
    context = SENTENCE_START
    for match in _CASING_TOKENS.finditer(text):
        if match["word"]:
            yield match, context
            context = MID_SENTENCE
        elif match["closing"]:
            context = AFTER_QUOTE
        else:  # a stop without a closing quote, an opening quote, a newline
            context = SENTENCE_START


# "a dog named spot": the word after "named" is a name throughout the story,
# unless it is one of these (the only non-names seen after "named").
_NAME_INTRODUCTION = re.compile(r"\bnamed ([^\W\d_]+)")
NOT_NAMES = frozenset("a an the her his him it its me my our their them us your".split())


class Truecaser:
    """Restores the casing of lowercased English text (see module docstring)."""

    def __init__(self, cased_texts: Iterable[str]):
        counts = {MID_SENTENCE: defaultdict(Counter), AFTER_QUOTE: defaultdict(Counter)}
        for text in cased_texts:
            for match, context in _words_in_context(text):
                if context != SENTENCE_START:
                    word = match.group()
                    counts[context][word.lower()][word] += 1
        self.casing = {context: {word: forms.most_common(1)[0][0] for word, forms in table.items()}
                       for context, table in counts.items()}

    def truecase(self, text: str) -> str:
        names = set(_NAME_INTRODUCTION.findall(text)) - NOT_NAMES
        parts, done = [], 0
        for match, context in _words_in_context(text):
            word = match.group()
            cased = self.casing[MID_SENTENCE].get(word, word)
            if word in names or context == SENTENCE_START:
                cased = cased[0].upper() + cased[1:]
            elif context == AFTER_QUOTE:
                cased = self.casing[AFTER_QUOTE].get(word, cased)
            parts += [text[done:match.start()], cased]
            done = match.end()
        parts.append(text[done:])
        return "".join(parts)


def _tinystories_split() -> int:
    """Index of the first held-out ajaykumar story."""
    return int(len(cased_stories()) * (1 - TINYSTORIES_VAL_FRACTION))


@functools.cache
def truecaser() -> Truecaser:
    """Learned from the normal-cased TinyStories training stories."""
    return Truecaser(fix_mojibake(story) for story in cased_stories()[:_tinystories_split()])


def measure_truecasing() -> dict[str, float]:
    """Score truecaser() on the held-out ajaykumar stories, which it never saw.

    word_accuracy: fraction of words restored exactly;
    capitalised_word_accuracy: the same, over words with a capital letter;
    story_accuracy: fraction of stories restored without a single error.
    """
    words = capitalised = words_right = capitalised_right = stories_right = 0
    held_out = [fix_mojibake(story) for story in cased_stories()[_tinystories_split():]]
    for story in held_out:
        restored = truecaser().truecase(story.lower())
        pairs = list(zip(re.findall(r"[^\W\d_]+", story), re.findall(r"[^\W\d_]+", restored)))
        right = [original == guess for original, guess in pairs]
        has_capital = [original != original.lower() for original, _ in pairs]
        words += len(pairs)
        words_right += sum(right)
        capitalised += sum(has_capital)
        capitalised_right += sum(r and c for r, c in zip(right, has_capital))
        stories_right += all(right)
    return {"word_accuracy": words_right / words,
            "capitalised_word_accuracy": capitalised_right / capitalised,
            "story_accuracy": stories_right / len(held_out)}


# ----------------------------------------------------------------------------
# Splits


@functools.cache
def _pretrain_sources(split: str) -> dict[str, tuple[str, ...]]:
    books = gutenberg_books()
    stories = [fix_mojibake(story) for story in cased_stories()]
    held_out = _tinystories_split()
    if split == "val":
        return {"gutenberg": tuple(books[name] for name in VAL_BOOKS), "tinystories": tuple(stories[held_out:])}
    caser = truecaser()
    restored = [caser.truecase(fix_mojibake(story)) for story in lowercase_only_stories()]
    return {"gutenberg": tuple(text for name, text in books.items() if name not in VAL_BOOKS),
            "tinystories": tuple(stories[:held_out] + restored)}


def pretrain_sources(split: Literal["train", "val"]) -> dict[str, list[str]]:
    """The pretraining documents by source ("gutenberg", "tinystories"), so a run can weight them."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    return {name: list(documents) for name, documents in _pretrain_sources(split).items()}


def pretrain_documents(split: Literal["train", "val"]) -> list[str]:
    """Gutenberg books and TinyStories stories, one string per document."""
    return [document for documents in pretrain_sources(split).values() for document in documents]


# ----------------------------------------------------------------------------
# Task data, for the tokenizer


def translation_pairs(language: Literal["fra", "deu"]) -> list[tuple[str, str]]:
    """Tatoeba (english, translation) pairs, without eng-deu's junk first line
    and eng-fra's cut-off last line."""
    path = DATA_DIR / "translation" / f"eng-{language}.tsv"
    text = read_text(path)
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines.pop()  # the last line is cut off
    pairs = [line.split("\t") for line in lines if line and line != "1\t2"]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{path}: expected english<TAB>translation on every line")
    return [(english, translation) for english, translation in pairs]


if __name__ == "__main__":
    for split in ("train", "val"):
        documents = pretrain_documents(split)
        size = sum(len(d.encode()) for d in documents)
        print(f"{split}: {len(documents)} documents, {size / 1e6:.1f} MB")
    print(f"lowercase-only TinyStories restored by truecasing: {len(lowercase_only_stories())}")
    print("truecasing on held-out TinyStories:",
          ", ".join(f"{name} {value:.2%}" for name, value in measure_truecasing().items()))

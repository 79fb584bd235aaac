"""The training text: cleaning, splits that do not leak, and the truecaser."""

import pytest

from train import corpus

from .conftest import need_data

pytestmark = pytest.mark.slow  # the training text, built from the data


@pytest.fixture
def corpus_data():
    """The project's data that these tests read (../shared/data, or STUDIO_DATA_DIR)."""
    return need_data(corpus.DATA_DIR, "the training text's sources")


BOOK = """The Project Gutenberg EBook of A Test, by Someone

*** START OF THIS PROJECT GUTENBERG EBOOK A TEST ***
Produced by a volunteer

CHAPTER I

Once upon a time.

End of the Project Gutenberg EBook of A Test
*** END OF THIS PROJECT GUTENBERG EBOOK A TEST ***
Donations and the license.
"""
OLD_STYLE_BOOK = """*Project Gutenberg Etext of A Test*
***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***
Legal text.
*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

A TEST

The story.

*Project Gutenberg Etext of A Test*
"""


def paragraphs(texts, min_length=150):
    """Long lines only: short ones ("The end.") may repeat by chance."""
    return {line for text in texts for line in text.split("\n") if len(line) >= min_length}


def test_strip_gutenberg():
    assert corpus.strip_gutenberg(BOOK) == "Produced by a volunteer\n\nCHAPTER I\n\nOnce upon a time.\n"
    assert corpus.strip_gutenberg(OLD_STYLE_BOOK) == "A TEST\n\nThe story.\n"
    with pytest.raises(ValueError, match="START OF"):
        corpus.strip_gutenberg("Just some text.\n")


def test_unwrap_lines_joins_wrapped_paragraphs_and_keeps_verse():
    wrapped = ("It was a bright cold day in April, and the clocks were striking\n"
               "thirteen. Winston Smith hurried home.\n")
    verse = "Twinkle, twinkle, little bat!\nHow I wonder what you're at!\n"
    indented = ("A long line of prose that is followed by an indented line of verse:\n"
                "     'How doth the little crocodile\n")
    assert corpus.unwrap_lines(wrapped) == wrapped.replace("striking\n", "striking ")
    assert corpus.unwrap_lines(verse) == verse
    assert corpus.unwrap_lines(indented) == indented


def test_split_stories():
    text = "Story one.\n\nStill one.\nStory two.\nStory three.\n\nEnd three.\n"
    assert corpus.split_stories(text) == ["Story one.\n\nStill one.", "Story two.", "Story three.\n\nEnd three."]


def test_fix_mojibake():
    assert corpus.fix_mojibake("â€œHi,â€ she said. Itâ€™s Josã©â€¦") == "“Hi,” she said. It’s José…"


def test_truecaser_restores_sentence_starts_and_names():
    caser = corpus.Truecaser(["Then Lily went to the park with Tom. Later, I saw Lily and Tom there."])
    assert caser.truecase("lily went to the park. she was happy.") == "Lily went to the park. She was happy."
    assert caser.truecase('"hi!" said tom. i saw a dog named rex. rex ran.') == \
        '"Hi!" said Tom. I saw a dog named Rex. Rex ran.'


def test_truecaser_on_tinystories(corpus_data):
    caser = corpus.truecaser()
    assert caser.truecase("lily went to the park. she was happy.") == "Lily went to the park. She was happy."
    scores = corpus.measure_truecasing()
    print("truecasing on held-out TinyStories:", scores)
    assert scores["word_accuracy"] > 0.99
    assert scores["capitalised_word_accuracy"] > 0.95


def test_lowercase_tinystories_skip_exactly_the_overlap(corpus_data):
    all_lowercase = corpus.split_stories(corpus.read_text(corpus.TINYSTORIES_DIR / "arnoochka_tinystories.txt"))
    kept = corpus.lowercase_only_stories()
    assert len(all_lowercase) - len(kept) == len(corpus.cased_stories())
    assert 4000 < len(kept) < len(all_lowercase)


def test_pretrain_splits_do_not_overlap(corpus_data):
    train, val = corpus.pretrain_documents("train"), corpus.pretrain_documents("val")
    books = corpus.gutenberg_books()
    assert len(books) == 45
    assert all(books[name] in val and books[name] not in train for name in corpus.VAL_BOOKS)
    assert sum(text in train for text in books.values()) == 45 - len(corpus.VAL_BOOKS)
    train_paragraphs = paragraphs(train)
    assert not train_paragraphs & paragraphs(val)
    assert not any("â€" in text for text in train + val)
    with pytest.raises(ValueError, match="split"):
        corpus.pretrain_documents("test")


def test_tinystories_validation_file_is_never_training_text(corpus_data):
    validation = corpus.tinystories_validation_text()
    assert len(validation) > 700_000 and "â€" not in validation
    assert not paragraphs([validation]) & paragraphs(corpus.pretrain_documents("train"))


def test_translation_pairs(corpus_data):
    assert len(corpus.translation_pairs("fra")) == 76_037
    assert corpus.translation_pairs("deu")[0] == ("Go.", "Geh.")  # the junk "1<TAB>2" line is gone
    pairs = corpus.translation_pairs("fra") + corpus.translation_pairs("deu")
    assert ("My watch is five minutes slow.", "Ma montre retarde de cinq minutes.") in pairs
    assert not any("\r" in text or "\t" in text for pair in pairs for text in pair)

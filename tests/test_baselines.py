"""The baselines beside every score (train/baselines.py): computed from the splits they are given,
the generalisation set far from every training source, and what counts as a loop."""
from __future__ import annotations

import pytest

from train.baselines import (TranslationLookup, TrigramIndex, best_constant, last_sentence, loops, summary_baselines,
                             translation_baselines, trigrams, typical_length)


def pair(text: str, translation: str, source: str = "English", target: str = "French") -> dict:
    return {"source": source, "target": target, "text": text, "translation": translation}


TRAIN = [pair("The cat sleeps.", "Le chat dort."), pair("I like apples.", "J'aime les pommes."),
         pair("Le chat dort.", "The cat sleeps.", "French", "English")]


def test_the_nearest_training_pair_comes_from_the_training_split_in_the_same_direction():
    test = [pair("The cat is sleeping.", "Le chat dort."), pair("I like red apples.", "J'aime les pommes rouges.")]
    found = translation_baselines(TranslationLookup(TRAIN), test)
    assert found["copy the source"] == ["The cat is sleeping.", "I like red apples."]
    assert found["nearest training pair"] == ["Le chat dort.", "J'aime les pommes."]
    # a changed split moves the baseline: it is looked up, not copied
    moved = translation_baselines(TranslationLookup([pair("The cat is sleeping!", "Le chat est en train de dormir."),
                                                     *TRAIN]), test)
    assert moved["nearest training pair"][0] == "Le chat est en train de dormir."
    # the other direction's pairs are never the answer
    french = [pair("Le chat dort bien.", "The cat sleeps well.", "French", "English")]
    assert translation_baselines(TranslationLookup(TRAIN), french)["nearest training pair"] == ["The cat sleeps."]
    # French -> German has no pairs of its own: it is looked up through English, as the tab translates it
    through = [*TRAIN, pair("The cat sleeps.", "Die Katze schläft.", "English", "German")]
    german = [pair("Le chat dort!", "Die Katze schläft!", "French", "German")]
    assert translation_baselines(TranslationLookup(through), german)["nearest training pair"] == ["Die Katze schläft."]
    assert translation_baselines(TranslationLookup(TRAIN), german)["nearest training pair"] == [""]


def test_the_similarity_is_the_cosine_of_the_trigram_sets():
    a, b = "The cat sleeps.", "The cat is sleeping."
    expected = len(trigrams(a) & trigrams(b)) / (len(trigrams(a)) * len(trigrams(b))) ** 0.5
    (index, similarity), = TrigramIndex([a]).nearest([b])
    assert index == 0 and similarity == pytest.approx(expected, rel=1e-5)
    assert TrigramIndex([a]).nearest([a])[0][1] == pytest.approx(1.0, rel=1e-5)
    far, trained = TranslationLookup(TRAIN).similarity(["Zebras vex wolves.", "Le chat dort."])
    assert far < 0.3 and trained == pytest.approx(1.0, rel=1e-5)  # any direction's source counts


def test_the_best_constant_summary_is_chosen_on_the_training_split():
    lessons = ["Slow and steady wins the race.", "Slow and steady wins.", "Do not count your chickens.",
               "Steady wins the race."]
    assert best_constant(lessons) == "Slow and steady wins the race."
    train = [{"summary": lesson, "source": "aesop"} for lesson in lessons]
    test = [{"article": "A hare ran. A tortoise walked. The tortoise won.", "summary": "x", "source": "aesop"}]
    found = summary_baselines(train, test)
    assert found["best constant answer"] == ["Slow and steady wins the race."]
    assert found["last sentence"] == ["The tortoise won."]
    other = [{"summary": "Look before you leap.", "source": "aesop"}] * 3 + train
    assert summary_baselines(other, test)["best constant answer"] == ["Look before you leap."]
    # the derived summaries' constant comes from their own kind
    derived = [{"summary": "The user asks the assistant for help with music.", "source": "sgd-derived"}]
    assert summary_baselines(train + derived, [{**test[0], "source": "sgd-derived"}])["best constant answer"] \
        == [derived[0]["summary"]]
    assert last_sentence('He said "no." Then he left!  ') == "Then he left!"


def test_a_loop_is_a_word_trigram_three_times_or_an_output_far_longer_than_its_reference():
    assert loops("Où est la train de train de train de train de", "Où est la gare ?")
    assert not loops("Où est la gare ?", "Où est la gare ?")
    assert loops("a b c d e f g h i j k l", "a b c")  # 23 characters against 5
    assert not loops("the cat and the cat and the dog", "the cat and the cat and the dog")  # twice is not a loop
    # a reference shorter than its task's typical answer counts as that long: one ordinary reply to a quiz
    reply = "I think it is the capital of France, the city of light."
    assert loops(reply, "Paris") and not loops(reply, "Paris", typical_length(["Hello there, how are you?"] * 3))
    assert loops(reply * 3, "Paris", typical=20)  # but not without limit


def test_the_typical_length_is_the_median_of_the_training_references():
    assert typical_length(["a", "abc", "abcdefghij"]) == 3
    assert typical_length([]) == 0


@pytest.mark.slow  # the real training split
def test_no_generalisation_source_comes_near_a_training_source(task_splits):
    from train.data import FAR_FROM_TRAINING, far_from_training

    train, far, far_val = (task_splits["translate"][split] for split in ("train", "far-test", "far-val"))
    index = TrigramIndex(sorted({r["text"] for r in train}))
    for generalisation, least in ((far, 100), (far_val, 35)):  # the test set, and its validation set
        directions = {(r["source"], r["target"]) for r in generalisation}
        assert len(directions) == 6 and all(sum((r["source"], r["target"]) == d for r in generalisation) >= least
                                            for d in directions)
        assert max(similarity for _, similarity in index.nearest([r["text"] for r in generalisation])) \
            < FAR_FROM_TRAINING
    assert not {r["text"] for r in far} & {r["text"] for r in far_val}  # no sentence chosen on is tested on
    # a sentence that training comes to know leaves the set, in each direction it is the source of
    known = far[0]["text"]
    assert any(r["text"] == known for r in far_from_training(train[:1000])["far-test"])
    assert not any(r["text"] == known for r in far_from_training([pair(known, "x"), *train[:1000]])["far-test"])

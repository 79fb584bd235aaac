"""Each task's data set, made from ../shared/data, with its held-out test split fixed before any training.

    python -m train.data --out runs/task-data

writes {task}-train.jsonl, {task}-val.jsonl and {task}-test.jsonl for dialogue, translate and
summarize (plus summarize-derived-test.jsonl and translate-far-{val,test}.jsonl, see below): one JSON
object per line, in the formats of RECORD_FORMATS, which is also what `python -m train.finetune
--data` reads.

How the splits are made
- A split is by *unit*, never by record: a conversation (dialogue), a group of sentences linked
  by translation (translation), a fable or a dialogue (summarisation). Units are put in the
  order of the SHA-256 of their key, which depends on nothing but the data, and test takes the
  first units, then validation, then training the rest. So the same data always gives the same
  splits, and no unit has records in two splits.
- A held-out unit gives one record per category (a dialogue source, a translation direction),
  chosen at random with the unit's key as seed, until each category has its fixed number:
  the test sets are small and fixed so that evaluation stays fast, and one record per
  conversation keeps them varied. A unit's other records are dropped, never trained on.

Dialogue (`DIALOGUE_TEST` responses per source): Topical-Chat, Schema-Guided Dialogue (the
SYSTEM side), Taskmaster-4 coffee orders (the assistant side) and chatterbot-corpus. Every bot
turn is a response to learn, with the user turn before it as the message and at most
HISTORY_PAIRS earlier exchanges, so a prompt stays well inside a 512-token context. In
Topical-Chat both speakers are people, so every turn after the first is a response. Each
source has a fixed persona line (PERSONAS) that says which kind of conversation it is. Training
takes at most DIALOGUE_TRAIN responses per source, as the sources differ 20-fold in size.

Translation (Tatoeba eng-fra and eng-deu, both directions): sentences that are translations of
one another, directly or through a shared translation, form one unit (a connected component:
"Go." - "Va !" - "Go!"), so no sentence of a test pair, in any language, occurs in training.
`TRANSLATE_TEST` pairs per direction; a test pair has one reference translation. Tatoeba is full of
near-paraphrases, so a test pair is often close to a training pair; translate-far-test.jsonl, the
generalisation set, holds pairs whose source is far from every training source (far_from_training),
and translate-far-val.jsonl the same of other sentences, for the choices made on validation.

Summarisation: *The Aesop for Children* fable -> lesson pairs are the real, human-written
summaries; summarize-test.jsonl holds only those (`AESOP_TEST` fables), so the headline ROUGE
is measured on them. The other pairs are derived, as the data README suggests, from a
Schema-Guided Dialogue conversation and the structured facts it comes with, its services
(Restaurants_1, Weather_1, ...): the article is the transcript ("User: ..." / "Assistant: ..."
lines) of a conversation of at most DERIVED_MAX_CHARS characters, and the summary is one
sentence naming what the user wanted help with, from a fixed phrase per service
(SERVICE_TOPICS): "The user asks the assistant for help with restaurants and the weather."
These are true of their conversation by construction, but they only name topics, so they
teach the format (one short sentence after TL;DR:) more than the content, and training takes
only DERIVED_TRAIN of them next to the 106 Aesop pairs. Their own test split is
summarize-derived-test.jsonl, reported apart from Aesop.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from tasks import TASKS
from tasks.base import one_line
from tasks.dialogue import PERSONAS, DialogueInputs
from tasks.summarization import SummarizeInputs
from tasks.translation import PIVOT, TranslateInputs

from .baselines import TranslationLookup
from .corpus import DATA_DIR, read_text, translation_pairs

SPLITS = ("train", "val", "test")
HISTORY_PAIRS = 2  # earlier (user, bot) exchanges kept before the message
DIALOGUE_TEST, DIALOGUE_VAL, DIALOGUE_TRAIN = 50, 25, 5000  # responses per source
TRANSLATE_TEST, TRANSLATE_VAL = 200, 50  # pairs per direction and language; training takes all the rest
AESOP_TEST, AESOP_VAL = 30, 10  # fables; training takes the rest (106)
DERIVED_TEST, DERIVED_VAL, DERIVED_TRAIN = 100, 50, 500  # derived summarisation pairs
# Sentences written for this project, each in English, French and German, of everyday words in
# combinations Tatoeba does not have ("The goat ate the letter from the mayor."): the
# generalisation set, kept to the sentences that are FAR_FROM_TRAINING (far_from_training). Its
# validation set is other sentences of the same kind, so that what is chosen for generalisation
# (a checkpoint, a decoding default) is chosen without reading the test sentences.
FAR_SENTENCES = {"far-test": Path(__file__).with_name("far_from_training.tsv"),
                 "far-val": Path(__file__).with_name("far_from_training_val.tsv")}
FAR_FROM_TRAINING = 0.5  # no training source this similar (character-trigram cosine)
DERIVED_MAX_CHARS = 1500  # so a whole transcript fits a 512-token context next to its summary
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's is ~10x faster, same result

RECORD_FORMATS = {
    "dialogue": '{"persona": str, "history": [[user, bot], ...], "message": str, "response": str}',
    "translate": '{"source": "English"|"French"|"German", "target": ..., "text": str, "translation": str}',
    "summarize": '{"article": str, "summary": str}',
}
# A dialogue record may leave out persona and history. Other keys are ignored by training: the
# files written here add "id" (the unit the record comes from) and, for summarisation, "source"
# ("aesop" or "sgd-derived").

SERVICE_TOPICS = {
    "Alarm": "alarms", "Banks": "banking", "Buses": "a bus trip", "Calendar": "the calendar",
    "Events": "events", "Flights": "flights", "Homes": "finding a home", "Hotels": "a place to stay",
    "Media": "a film to watch at home", "Messaging": "sharing a location", "Movies": "movies",
    "Music": "music", "Payment": "a payment", "RentalCars": "a rental car", "Restaurants": "restaurants",
    "RideSharing": "a taxi ride", "Services_1": "a hair salon", "Services_2": "a dentist",
    "Services_3": "a doctor", "Services_4": "a therapist", "Trains": "a train trip",
    "Travel": "places to visit", "Weather": "the weather",
}


# --- records <-> task inputs ------------------------------------------------------------------

def example_from_record(task: str, record: dict) -> tuple[Any, str]:
    """The task inputs and the target text of one record (see RECORD_FORMATS)."""
    if task not in RECORD_FORMATS:
        raise ValueError(f"no data format for task {task!r}; tasks with adapters: {', '.join(RECORD_FORMATS)}")
    try:
        if task == "dialogue":
            history = [(user, bot) for user, bot in record.get("history", [])]
            return DialogueInputs(record["message"], history, record.get("persona", "")), record["response"]
        if task == "translate":
            return TranslateInputs(record["text"], record["source"], record["target"]), record["translation"]
        return SummarizeInputs(record["article"]), record["summary"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a {task} record ({type(e).__name__}: {e}); expected {RECORD_FORMATS[task]}") from None


def read_records(path: Path, task: str, limit: int | None = None) -> list[dict]:
    """The first `limit` (None: all) records of a JSONL file, each checked by making its training pair."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found (make the task data with `python -m train.data`)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if limit is not None and len(records) >= limit:
            break
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            TASKS[task].format_example(*example_from_record(task, record))
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def write_records(path: Path, records: Iterable[dict]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


# --- splitting --------------------------------------------------------------------------------

@dataclass
class Unit:
    key: str  # what the split goes by: a conversation id, a group of sentences, a fable
    records: list[tuple[str, dict]]  # (category, record); quotas are per category


def split_units(units: Iterable[Unit], test: dict[str, int], val: dict[str, int],
                train: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """Records by split (see the module docstring). test, val and train give the number of records
    per category; train=None means all the rest, and a category train does not name gets none."""
    quotas = {"test": test, "val": val, "train": train or {}}
    splits = {name: [] for name in SPLITS}
    filled = {name: Counter() for name in SPLITS}

    def room(split: str, category: str) -> bool:
        return (split == "train" and train is None) or filled[split][category] < quotas[split].get(category, 0)

    for unit in sorted(units, key=lambda unit: hashlib.sha256(unit.key.encode()).hexdigest()):
        held_out = next((split for split in ("test", "val") if any(room(split, c) for c, _ in unit.records)), None)
        if held_out is None:
            for category, record in unit.records:
                if room("train", category):
                    splits["train"].append(record)
                    filled["train"][category] += 1
            continue
        by_category = defaultdict(list)
        for category, record in unit.records:
            by_category[category].append(record)
        chooser = random.Random(unit.key)  # a str seed is hashed the same way on every run
        for category, category_records in sorted(by_category.items()):
            if room(held_out, category):
                splits[held_out].append(chooser.choice(category_records))
                filled[held_out][category] += 1
    return splits


# --- dialogue ---------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in read_text(path).splitlines() if line.strip()]


def merge_same_speaker(turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(speaker, text) turns with consecutive turns of one speaker joined, so speakers alternate."""
    merged: list[tuple[str, str]] = []
    for speaker, text in turns:
        text = " ".join(str(text).split())
        if not text:
            continue
        if merged and merged[-1][0] == speaker:
            merged[-1] = (speaker, f"{merged[-1][1]} {text}")
        else:
            merged.append((speaker, text))
    return merged


def dialogue_records(source: str, conversation_id: str, turns: list[tuple[str, str]],
                     bot_speakers: set[str] | None) -> list[dict]:
    """One record per bot turn that follows a user turn; bot_speakers None: every turn after the first."""
    turns = merge_same_speaker(turns)
    records = []
    for i in range(1, len(turns)):
        if bot_speakers is not None and turns[i][0] not in bot_speakers:
            continue
        earlier = [text for _, text in turns[max(0, i - 1 - 2 * HISTORY_PAIRS):i - 1]]
        if len(earlier) % 2:
            earlier = earlier[1:]  # history is whole (user, bot) exchanges
        records.append({"persona": PERSONAS[source], "history": [earlier[j:j + 2] for j in range(0, len(earlier), 2)],
                        "message": turns[i - 1][1], "response": turns[i][1], "id": f"{source}:{conversation_id}#{i}"})
    return records


def sgd_id(conversation: dict) -> str:
    """SGD numbers dialogues per split ("1_00000" is in dev and in train): the split is part of the id."""
    return f"{conversation['file'].split('/')[0]}/{conversation['id']}"


def dialogue_units() -> list[Unit]:
    """One unit per conversation; chatterbot conversations that open with the same line are one unit."""
    folder = DATA_DIR / "dialogue"
    conversations = []  # (source, conversation id, unit key, [(speaker, text)], bot speakers)

    def add(source, conversation_id, turns, bots, key=None):
        conversations.append((source, conversation_id, key or f"{source}:{conversation_id}", turns, bots))

    for c in read_jsonl(folder / "topicalchat.jsonl"):
        add("topicalchat", c["id"], [(t["speaker"], t["text"]) for t in c["turns"]], None)
    for c in read_jsonl(folder / "sgd.jsonl"):
        add("sgd", sgd_id(c), [(t["speaker"], t["text"]) for t in c["turns"]], {"SYSTEM"})
    for c in read_jsonl(folder / "taskmaster4_coffee.jsonl"):
        add("taskmaster", c["id"], [(t["speaker"], t["text"]) for t in c["turns"]], {"assistant"})
    yml_files = sorted((folder / "chatterbot").glob("*.yml"))
    if not yml_files:
        raise FileNotFoundError(f"no chatterbot-corpus files (*.yml) in {folder / 'chatterbot'}")
    for path in yml_files:
        for n, lines in enumerate(yaml.load(read_text(path), Loader=YAML_LOADER)["conversations"]):
            # A chatterbot conversation is a list of lines, the user's first, then alternating. Many
            # open with the same line ("Hi, How is it going?" -> "Good" / "Fine" / ...): grouping them
            # keeps a held-out opening line out of training.
            turns = [("user" if i % 2 == 0 else "bot", line) for i, line in enumerate(lines)]
            add("chatterbot", f"{path.stem}/{n}", turns, {"bot"}, key=f"chatterbot:{' '.join(str(lines[0]).split())}")
    members: dict[str, list[tuple]] = defaultdict(list)
    seen = set()
    for source, conversation_id, key, turns, bots in conversations:
        if tuple(turns) in seen:
            continue  # a verbatim copy of an earlier conversation (Taskmaster-4 has 23)
        seen.add(tuple(turns))
        members[key].append((source, conversation_id, turns, bots))
    return [Unit(key, [(source, record) for source, conversation_id, turns, bots in conversations
                       for record in dialogue_records(source, conversation_id, turns, bots)])
            for key, conversations in members.items()]


def dialogue_splits() -> dict[str, list[dict]]:
    return split_units(dialogue_units(), test=dict.fromkeys(PERSONAS, DIALOGUE_TEST),
                       val=dict.fromkeys(PERSONAS, DIALOGUE_VAL), train=dict.fromkeys(PERSONAS, DIALOGUE_TRAIN))


# --- translation ------------------------------------------------------------------------------

LANGUAGE_NAMES = {"fra": "French", "deu": "German"}


def translation_units() -> list[Unit]:
    """Connected components of sentences linked by a Tatoeba pair, both directions of every pair."""
    # Whitespace made plain first, as the prompts make it: "message ?" with a narrow no-break
    # space and with a plain one are the same sentence to the model, so they must be one unit.
    pairs = [(language, one_line(english), one_line(other)) for language in LANGUAGE_NAMES
             for english, other in translation_pairs(language)]
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(sentence):
        while parent.setdefault(sentence, sentence) != sentence:
            parent[sentence] = parent[parent[sentence]]  # path halving keeps the trees flat
            sentence = parent[sentence]
        return sentence

    for language, english, other in pairs:
        parent[root(("eng", english))] = root((language, other))
    components = defaultdict(list)
    for language, english, other in pairs:
        components[root(("eng", english))].append((language, english, other))
    units = []
    for members in components.values():
        key = min(english for _, english, _ in members)  # every component has an English sentence
        records = []
        for language, english, other in members:
            name = LANGUAGE_NAMES[language]
            records.append((f"English->{name}", {"source": "English", "target": name, "text": english,
                                                 "translation": other, "id": f"tatoeba:{key}"}))
            records.append((f"{name}->English", {"source": name, "target": "English", "text": other,
                                                 "translation": english, "id": f"tatoeba:{key}"}))
        units.append(Unit(key, records))
    return units


def translation_splits() -> dict[str, list[dict]]:
    directions = [f"English->{name}" for name in LANGUAGE_NAMES.values()] + \
                 [f"{name}->English" for name in LANGUAGE_NAMES.values()]
    splits = split_units(translation_units(), test=dict.fromkeys(directions, TRANSLATE_TEST),
                         val=dict.fromkeys(directions, TRANSLATE_VAL))
    return {**splits, **far_from_training(splits["train"])}


EXAMPLE_WORDS = range(4, 9)  # a Translate example is a sentence of this many words
# The directions the Translate tab offers, in the order of its examples.
EXAMPLE_DIRECTIONS = [("English", "French"), ("English", "German"), ("French", "English"), ("German", "English"),
                      ("French", "German"), ("German", "French")]


def translation_examples(val: list[dict]) -> list[tuple[str, str, str]]:
    """The Translate tab's examples, (text, source, target): for each of EXAMPLE_DIRECTIONS, the
    first validation source in the split's order with EXAMPLE_WORDS words, from a unit no earlier
    example used. French <-> German has no pairs of its own, so its text is the source of a
    French or German validation pair into English."""
    examples, used = [], set()
    for source, target in EXAMPLE_DIRECTIONS:
        into = target if PIVOT in (source, target) else PIVOT
        record = next(r for r in val if (r["source"], r["target"]) == (source, into) and r["id"] not in used
                      and len(r["text"].split()) in EXAMPLE_WORDS)
        examples.append((record["text"], source, target))
        used.add(record["id"])
    return examples


def far_from_training(train: list[dict]) -> dict[str, list[dict]]:
    """The generalisation sets, by split ("far-test", and its validation set "far-val"): the pairs
    of FAR_SENTENCES[split] in every direction the Translate tab offers (French <-> German too),
    each whose source has no training source, of any direction, with a character-trigram
    similarity of FAR_FROM_TRAINING or more. One lookup indexes the training sources for both."""
    lookup = TranslationLookup(train)
    sets = {}
    for split, path in FAR_SENTENCES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        languages = lines[0].split("\t")
        records = []
        for number, line in enumerate(lines[1:], 1):
            sentences = dict(zip(languages, line.split("\t"), strict=True))
            records += [{"source": source, "target": target, "text": sentences[source],
                         "translation": sentences[target], "id": f"{split}:{number}"}
                        for source in languages for target in languages if source != target]
        similarity = lookup.similarity([r["text"] for r in records])
        sets[split] = [r for r, near in zip(records, similarity) if near < FAR_FROM_TRAINING]
    return sets


# --- summarisation ----------------------------------------------------------------------------

def aesop_units() -> list[Unit]:
    fables = json.loads(read_text(DATA_DIR / "summarization" / "aesop4children.json"))
    # Keyed by the page each fable comes from: two pairs of different fables share a title.
    return [Unit(f["source"], [("aesop", {"article": f["fable"].strip(), "summary": f["lesson"].strip(),
                                          "source": "aesop", "id": f"aesop:{f['source']}"})])
            for f in fables]


def derived_summary(services: list[str]) -> str:
    """"The user asks the assistant for help with X, Y and Z." from SGD service names."""
    topics = []
    for service in services:
        family = service if service.startswith("Services_") else service.split("_")[0]
        if family not in SERVICE_TOPICS:
            raise ValueError(f"no topic phrase for SGD service {service!r}; add one to SERVICE_TOPICS")
        if SERVICE_TOPICS[family] not in topics:
            topics.append(SERVICE_TOPICS[family])
    listed = topics[0] if len(topics) == 1 else f"{', '.join(topics[:-1])} and {topics[-1]}"
    return f"The user asks the assistant for help with {listed}."


def derived_units() -> list[Unit]:
    """SGD conversations short enough to fit, as transcript -> summary from their services."""
    speakers = {"USER": "User", "SYSTEM": "Assistant"}
    units = []
    for c in read_jsonl(DATA_DIR / "dialogue" / "sgd.jsonl"):
        article = "\n".join(f"{speakers[t['speaker']]}: {' '.join(t['text'].split())}" for t in c["turns"])
        if len(article) <= DERIVED_MAX_CHARS:
            record = {"article": article, "summary": derived_summary(c["services"]), "source": "sgd-derived",
                      "id": f"sgd:{sgd_id(c)}"}
            units.append(Unit(sgd_id(c), [("sgd-derived", record)]))
    return units


def summarize_splits() -> dict[str, list[dict]]:
    """Aesop and derived pairs together in train and val; test is Aesop only (see derived_test)."""
    aesop = split_units(aesop_units(), test={"aesop": AESOP_TEST}, val={"aesop": AESOP_VAL})
    derived = split_units(derived_units(), test={"sgd-derived": DERIVED_TEST}, val={"sgd-derived": DERIVED_VAL},
                          train={"sgd-derived": DERIVED_TRAIN})
    return {"train": interleave(aesop["train"], derived["train"]), "val": aesop["val"] + derived["val"],
            "test": aesop["test"], "derived-test": derived["test"]}


def interleave(a: list, b: list) -> list:
    """a and b mixed evenly, in a fixed order, so the first N of the file hold both kinds."""
    tagged = [(i / len(a), 0, x) for i, x in enumerate(a)] + [(i / len(b), 1, x) for i, x in enumerate(b)]
    return [x for *_, x in sorted(tagged, key=lambda t: t[:2])]


# --- the task formats in the pretraining stream -----------------------------------------------

PAIRS_PER_DOCUMENT = 8  # translation lines per document, as in a few-shot prompt


def pretraining_documents(splits: dict[str, dict[str, list[dict]]] | None = None) -> dict[str, list[str]]:
    """Training records only, written the way the tabs prompt, by source for the pretraining mix:
    "translation": documents of PAIRS_PER_DOCUMENT `source = target` lines of one direction (the
    prompt-only translation format); "dialogue": speaker-tagged transcripts ending in the reply;
    "summaries": an article, TL;DR: and its summary. Test and validation units never appear.
    splits: each task's splits as BUILDERS make them, where the caller has them already."""
    splits = {task: build() for task, build in BUILDERS.items()} if splits is None else splits
    by_direction = defaultdict(list)
    for r in splits["translate"]["train"]:
        by_direction[r["source"], r["target"]].append(f"{one_line(r['text'])} = {one_line(r['translation'])}")
    translation = ["\n".join(lines[i:i + PAIRS_PER_DOCUMENT])
                   for lines in by_direction.values() for i in range(0, len(lines), PAIRS_PER_DOCUMENT)]

    def formatted(task: str, records: list[dict]) -> list[str]:
        return ["".join(TASKS[task].format_example(*example_from_record(task, r))) for r in records]

    return {"translation": translation, "dialogue": formatted("dialogue", splits["dialogue"]["train"]),
            "summaries": formatted("summarize", splits["summarize"]["train"])}


BUILDERS = {"dialogue": dialogue_splits, "translate": translation_splits, "summarize": summarize_splits}


def build(out: Path, tasks: Iterable[str] = tuple(BUILDERS)) -> dict[str, dict[str, int]]:
    """Write every split file of `tasks` to out; returns the record counts per task and split."""
    counts = {}
    for task in tasks:
        counts[task] = {split: write_records(Path(out) / f"{task}-{split}.jsonl", records)
                        for split, records in BUILDERS[task]().items()}
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m train.data", description=(
        "Build each task's train/val/test JSONL from ../shared/data, with deterministic held-out splits "
        "(see this module's docstring for how). Run once, before any fine-tuning."))
    p.add_argument("--out", type=Path, required=True, help="directory for {task}-{train,val,test}.jsonl")
    p.add_argument("--tasks", nargs="+", choices=list(BUILDERS), default=list(BUILDERS), help="tasks to build")
    args = p.parse_args(argv)
    for task, counts in build(args.out, args.tasks).items():
        print(f"{task}: " + ", ".join(f"{split} {n:,}" for split, n in counts.items()))


if __name__ == "__main__":
    main()

"""Evaluate a checkpoint on the held-out splits, prompting the base model and with each task's adapter.

    python -m train.data --out runs/task-data      # once: the held-out splits (needs ../shared/data)
    python -m train.eval --model bundled --data runs/task-data --out docs/eval-bundled.md \
        --on-by-default assets/adapters      # and let the validation rows pick the adapters the tabs start with
    python -m train.eval --model bundled --limit 5  # a quick run: 5 examples a split, a short text

Runs every measure twice: on the validation splits, which every decision reads (the adapters the
tabs start with, the shipping gate of scripts/model_card.py), and on the test splits, for the card
alone. Writes a markdown table and a JSON file with the same numbers (same name, .json); the JSON's
validation headline rows keep their items' statistics too (per_item), so that the gate compares
two editions on the same items, where their difference varies far less than either score:
- bits per byte of the TinyStories validation text (train.metrics.bits_per_byte): the base model
  only, since no adapter is on when the app generates freely;
- translation: chrF and BLEU (sacrebleu, corpus level) per direction and over all directions, and
  the generalisation rows: sentences written for the purpose (others for validation than for the
  test) whose source is far from every training source (train.data.far_from_training), in the
  four directions to and from English and French <-> German, which the tab translates through
  English; the shipping gate reads the validation one too (GENERALISATION);
- summarisation: ROUGE-1/2/L F1 (rouge-score, Porter stemming), mean over the Aesop fables, and
  apart from them over the derived dialogue summaries;
- dialogue: the loss of the held-out responses given their transcripts, teacher forced;
- each task's loop rate at its tab's defaults: the outputs that repeat a word 3-gram three times
  or run past 2.5 times their reference, or their task's typical answer where the reference is
  shorter (train/baselines.py, loops); over every seed where the task samples;
- beside each chrF, BLEU and ROUGE, what answers with no model in them score on the same items
  (train/baselines.py), and in plain words where the model does not beat them.
Generation goes through run_task with each task's own defaults, as the app runs it: the base
with the GPT-2 paper's prompt (translation: four example pairs and greedy decoding; summary:
`TL;DR:`, top-k 2, the first 3 sentences of at most 100 tokens), the adapter with the format it
was trained on. Summarisation samples, so it is generated once with each of SEEDS and scored as
the mean over them, with its standard error: on 30 fables one seed's ROUGE-L spans about 4 points
over five seeds, more than an adapter gains. A greedy or exact score's standard error is a
bootstrap over its items (BOOTSTRAP resamples). Fixed seeds make a run repeat exactly.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from rouge_score import rouge_scorer
from sacrebleu.metrics import CHRF
from tqdm import tqdm

from engine.scheduler import MAX_BATCH, Scheduler
from model.adapters import active_adapter, adapter_names, load_adapters, write_on_by_default
from model.checkpoint import load_pretrained, pick_device
from tasks import TASKS, TaskDone, run_task
from tasks.translation import PIVOT

from .baselines import TranslationLookup, loops, summary_baselines, translation_baselines, typical_length
from .corpus import DATA_DIR, TINYSTORIES_DIR, tinystories_validation_text
from .data import FAR_FROM_TRAINING, FAR_SENTENCES, example_from_record, read_records
from .finetune import completion_nll, encode_records, shown_path
from .metrics import bits_per_byte

SEEDS = (0, 1, 2, 3, 4)  # summaries and chat replies are sampled, so they run once with each; greedy translation once
TEST_FILES = (*(f"{task}-{split}.jsonl" for split in ("train", "val", "test")
                for task in ("translate", "summarize", "dialogue")),
              *(f"translate-{split}.jsonl" for split in FAR_SENTENCES))
BPB_CHARS_PER_LIMIT = 2000  # with --limit N, bits per byte over the first N * this many characters
SYSTEMS = ("base", "adapter")  # the base model with the task's prompt; the same base with the task's adapter
SYSTEM_NAMES = {"base": "prompt", "adapter": "adapter"}
BOOTSTRAP = 200  # resamples of the items for the standard error of a greedy or exact score
TATOEBA = "Tatoeba"
FAR = "new sentences far from training"  # the generalisation set (train.data.far_from_training)
TO_AND_FROM_ENGLISH, THROUGH_ENGLISH = "to and from English", "French<->German (through English)"
LOOP_METRIC = "loop rate (% of outputs, lower is better)"
SUMMARY_SETS = {"aesop": "Aesop fable -> lesson", "sgd-derived": "derived: SGD dialogue -> services"}


def generate_all(task_name: str, model, tokenizer, records: list[dict], adapter_on: bool,
                 seed: int = SEEDS[0]) -> list[str]:
    """What the app would show for each record's inputs, sampled with `seed`: through a
    Scheduler, MAX_BATCH records at once, which gives each the bits it gets alone."""
    task = TASKS[task_name]
    params = replace(task.defaults, seed=seed)
    label = f"{task_name} ({'adapter' if adapter_on else 'base'}, seed {seed})"
    scheduler = Scheduler(model)

    def answer(record: dict) -> str:
        inputs, _ = example_from_record(task_name, record)
        events = run_task(task, scheduler, tokenizer, inputs, params, adapter_on)
        return next(e for e in events if isinstance(e, TaskDone)).text

    try:
        with ThreadPoolExecutor(MAX_BATCH) as pool:
            return list(tqdm(pool.map(answer, records), total=len(records), desc=label, leave=False,
                             dynamic_ncols=True))
    finally:
        scheduler.close()


def translation_rows(model, tokenizer, records: list[dict], systems: list[str], lookup: TranslationLookup,
                     typical: int, test_set: str = TATOEBA) -> list[dict]:
    """chrF and BLEU per direction and over all, each with the baselines' scores on the same
    records and a bootstrap standard error (greedy decoding has no seed noise, but 50 to 800
    sentences do); and the loop rate. A set with French <-> German pairs (the generalisation
    set) is scored over the four directions to and from English, and over French <-> German,
    apart."""
    # One run, with no standard error over seeds, holds only while translation decodes greedily.
    assert TASKS["translate"].defaults.greedy, "translation samples now: score it over SEEDS as summarisation is"
    outputs = {system: generate_all("translate", model, tokenizer, records, system == "adapter") for system in systems}
    baselines = translation_baselines(lookup, records)
    groups = {}
    for i, r in enumerate(records):
        groups.setdefault(f"{r['source']}->{r['target']}", []).append(i)
    groups = dict(sorted(groups.items()))
    english = [i for i, r in enumerate(records) if PIVOT in (r["source"], r["target"])]
    if len(english) < len(records):
        groups[TO_AND_FROM_ENGLISH] = english
        groups[THROUGH_ENGLISH] = [i for i, r in enumerate(records) if PIVOT not in (r["source"], r["target"])]
    else:
        groups["all directions"] = english
    rows = translation_scores(groups, records, outputs, baselines, test_set)
    rows.append(loop_row("translate", f"{test_set} all directions", records, outputs, "translation", typical))
    return rows


def translation_scores(groups: dict[str, list[int]], records: list[dict], outputs: dict[str, list[str]],
                       baselines: dict[str, list[str]], test_set: str) -> list[dict]:
    rows = []
    for name, chosen in groups.items():
        references = [records[i]["translation"] for i in chosen]
        for metric, score in (("chrF", sacrebleu.corpus_chrf), ("BLEU", sacrebleu.corpus_bleu)):
            def scored(texts: list[str]) -> float:
                return score([texts[i] for i in chosen], [references]).score
            values = {system: scored(texts) for system, texts in outputs.items()}
            errors, difference, items = None, None, None
            if metric == "chrF":
                statistics_of = {system: chrf_statistics([texts[i] for i in chosen], references)
                                 for system, texts in outputs.items()}
                errors, difference = bootstrap(summed_score("chrF", statistics_of), len(chosen), list(outputs))
                items = per_item("chrF", statistics_of, references)
            rows.append(row("translate", metric, f"{test_set} {name}", len(chosen), values, errors,
                            {baseline: scored(texts) for baseline, texts in baselines.items()}, difference, items))
    return rows


# --- Scores over resamples of their items ---------------------------------------------------------
# Each score here is a sum of per-item statistics turned into a number: chrF (sacrebleu sums each
# sentence's character n-gram counts into the corpus score), or a ratio of two sums (a loss per
# byte; a mean, the second column being ones). A resample's score is then its items' statistics
# summed: the same score as the metric's own on the resample, a hundred times faster.
CHRF_METRIC = CHRF()  # sacrebleu.corpus_chrf's settings


def chrf_statistics(texts: list[str], references: list[str]) -> np.ndarray:
    """One row of sacrebleu's chrF statistics a sentence."""
    return np.array(CHRF_METRIC._extract_corpus_statistics(texts, [references]))


def score_of_sums(score: str, sums: np.ndarray) -> float:
    """score: "chrF" or "ratio"."""
    return CHRF_METRIC._compute_score_from_stats(sums).score if score == "chrF" else float(sums[0] / sums[1])


def summed_score(score: str, statistics_of: dict[str, np.ndarray]):
    """score(picked item indices, system) -> the score of those items, for bootstrap."""
    return lambda picked, system: score_of_sums(score, statistics_of[system][picked].sum(0))


def bootstrap(score, n: int, systems: list[str], resamples: int = BOOTSTRAP) -> tuple[dict[str, float], float | None]:
    """The standard error of each system's score over its n items, from resamples of them (with
    replacement, a fixed generator): score(picked item indices, system) -> the score. And, where
    there are two systems, that of the second's score minus the first's (the adapter's minus the
    base's) on the same resamples: the two are scored on the same items, so their difference
    varies far less than either."""
    rng = random.Random(0)
    values = {system: [] for system in systems}
    for _ in range(resamples):
        picked = [rng.randrange(n) for _ in range(n)]
        for system in systems:
            values[system].append(score(picked, system))
    differences = [b - a for a, b in zip(*values.values())] if len(systems) == 2 else []
    return ({system: statistics.stdev(v) for system, v in values.items()},
            statistics.stdev(differences) if differences else None)


def per_item(score: str, statistics_of: dict[str, np.ndarray], references: list[str]) -> dict:
    """What pairs two editions' scores on the same items (paired_difference_error): each system's
    per-item statistics (as compact JSON text, so that the indented file stays readable), how they
    make the score, and a digest of the references, which names the items."""
    return {"score": score, "items": hashlib.sha256("\n".join(references).encode()).hexdigest()[:16],
            "statistics": {system: json.dumps(np.asarray(s).tolist(), separators=(",", ":"))
                           for system, s in statistics_of.items()}}


def paired_difference_error(now: dict, now_system: str, before: dict, before_system: str) -> float | None:
    """The standard error of row `now`'s score (its now_system) minus row `before`'s (its
    before_system), from a bootstrap over the items both were measured on: two editions find the
    same sentences hard, so the difference varies far less than either score (as the adapter's
    against the base's does). None unless both rows kept their items (per_item), the same ones."""
    a, b = now.get("per_item"), before.get("per_item")
    if not a or not b or (a["score"], a["items"]) != (b["score"], b["items"]):
        return None
    statistics_of = {"before": np.array(json.loads(b["statistics"][before_system])),
                     "now": np.array(json.loads(a["statistics"][now_system]))}
    return bootstrap(summed_score(a["score"], statistics_of), len(statistics_of["now"]), ["before", "now"])[1]


def loop_row(task: str, test_set: str, records: list[dict], outputs: dict[str, list[str]], reference_key: str,
             typical: int, per_seed: int = 1) -> dict:
    """The share of outputs that loop (train.baselines.loops, with the task's typical answer
    length from its training split), in percent; `outputs` may hold `per_seed` runs of the
    records one after another."""
    references = [r[reference_key] for r in records] * per_seed
    return row(task, LOOP_METRIC, test_set, len(records),
               {system: 100 * sum(loops(text, reference, typical) for text, reference in zip(texts, references))
                / len(texts) for system, texts in outputs.items()})


def summarization_rows(model, tokenizer, records: list[dict], test_set: str, systems: list[str],
                       train: list[dict]) -> list[dict]:
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    keys = ("rouge1", "rouge2", "rougeL")

    def item_scores(outputs: list[str]) -> dict[str, list[float]]:
        scores = [scorer.score(r["summary"], output) for r, output in zip(records, outputs)]
        return {key: [100 * s[key].fmeasure for s in scores] for key in keys}

    def mean_scores(outputs: list[str]) -> dict[str, float]:
        return {key: statistics.mean(values) for key, values in item_scores(outputs).items()}

    per_seed = {system: {key: [] for key in keys} for system in systems}  # one mean over the records a seed
    item_rouge_l = {system: np.zeros(len(records)) for system in systems}  # each record's mean over the seeds
    every_output = {system: [] for system in systems}
    for system in systems:
        for seed in SEEDS:
            outputs = generate_all("summarize", model, tokenizer, records, system == "adapter", seed)
            every_output[system] += outputs
            for key, values in item_scores(outputs).items():
                per_seed[system][key].append(statistics.mean(values))
            item_rouge_l[system] += np.array(item_scores(outputs)["rougeL"]) / len(SEEDS)
    baselines = {name: mean_scores(texts) for name, texts in summary_baselines(train, records).items()}
    sources = {r.get("source") for r in records}
    typical = typical_length([r["summary"] for r in train if r.get("source") in sources])
    items = per_item("ratio", {system: np.stack([values, np.ones(len(records))], 1)
                               for system, values in item_rouge_l.items()}, [r["summary"] for r in records])
    return [*(row("summarize", f"ROUGE-{key[5:]} F1", test_set, len(records),
                  {system: statistics.mean(per_seed[system][key]) for system in systems},
                  {system: standard_error(per_seed[system][key]) for system in systems},
                  {name: scores[key] for name, scores in baselines.items()}, items=items if key == "rougeL" else None)
              for key in keys),
            loop_row("summarize", test_set, records, every_output, "summary", typical, per_seed=len(SEEDS))]


def standard_error(values: list[float]) -> float | None:
    """Of the mean of `values` (one score per seed); None for a single value, which has none."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def dialogue_rows(model, tokenizer, records: list[dict], systems: list[str], train: list[dict]) -> list[dict]:
    """The held-out responses' loss given their transcripts, with a bootstrap standard error over
    the responses; the base model with the prompt alone is the baseline the adapter must beat.
    And the loop rate of the replies the tab's defaults write, sampled with each of SEEDS."""
    examples = encode_records("dialogue", records, tokenizer, model.config.n_positions).examples
    # Bits per byte as well as nats per token: a byte count does not depend on the tokenizer, so
    # models with different vocabularies compare.
    responses = [tokenizer.decode(e.ids[e.prompt_tokens:]) for e in examples]
    response_bytes = [len(response.encode("utf-8")) for response in responses]
    tokens = [len(e.ids) - e.prompt_tokens for e in examples]
    nats = {}
    for system in systems:
        with active_adapter(TASKS["dialogue"].adapter if system == "adapter" else None):
            nats[system] = [completion_nll(model, [e], tokenizer.eos_id)[0] for e in examples]
    replies = {system: [reply for seed in SEEDS
                        for reply in generate_all("dialogue", model, tokenizer, records, system == "adapter", seed)]
               for system in systems}
    rows = []
    for metric, sizes, scale in (("response loss (nats/token, lower is better)", tokens, 1.0),
                                 ("response loss (bits per byte, lower is better)", response_bytes, 1 / math.log(2))):
        statistics_of = {system: np.array([[scale * n, size] for n, size in zip(nats[system], sizes)])
                         for system in systems}
        loss = summed_score("ratio", statistics_of)
        everything = list(range(len(examples)))
        errors, difference = bootstrap(loss, len(examples), systems)
        rows.append(row("dialogue", metric, "held-out responses", len(examples),
                        {system: loss(everything, system) for system in systems}, errors, None, difference,
                        per_item("ratio", statistics_of, responses)))
    return [*rows, loop_row("dialogue", "held-out responses", records, replies, "response",
                            typical_length([r["response"] for r in train]), per_seed=len(SEEDS))]


# The base model's own row (task, metric, test set): it has no adapter, and lower is better.
LANGUAGE_MODELLING = ("language modelling", "bits per byte (lower is better)", "TinyStories validation (n in bytes)")
# Per task, the row that says whether its adapter beats the prompt alone, and whether higher is better.
HEADLINES = {
    "translate": ("chrF", f"{TATOEBA} all directions", True),
    "summarize": ("ROUGE-L F1", "Aesop fable -> lesson", True),
    "dialogue": ("response loss (bits per byte, lower is better)", "held-out responses", False),
}
# The generalisation row, which the shipping gate reads too: an edition may not generalise worse.
GENERALISATION = ("translate", "chrF", f"{FAR} {TO_AND_FROM_ENGLISH}", True)
HEADLINE_ROWS = {(task, metric, test_set) for task, (metric, test_set, _) in HEADLINES.items()} | {GENERALISATION[:3]}
BASELINE_METRICS = ("chrF", "ROUGE-L F1")  # the scores the card checks against their baselines


def find_row(rows: list[dict], task: str, metric: str, test_set: str) -> dict | None:
    return next((r for r in rows if (r["task"], r["metric"], r["test_set"]) == (task, metric, test_set)), None)


def standard_error_of(r: dict, system: str) -> float:
    """The standard error of a row's value over seeds; 0 for an exact or greedy one."""
    return (r.get("standard_error") or {}).get(system) or 0.0


def seed_noise(a_error: float, b_error: float) -> float:
    """How far seeds alone could move the difference of two scores with these standard errors:
    two standard errors of the difference; 0 for exact scores."""
    return 2 * math.hypot(a_error, b_error)


def better_beyond_noise(a: float, a_error: float, b: float, b_error: float, higher_is_better: bool) -> bool:
    """Whether score a beats score b by more than seed_noise; with no standard errors (exact
    scores), whether it beats it at all."""
    return (a - b if higher_is_better else b - a) > seed_noise(a_error, b_error)


def adapters_that_help(rows: list[dict]) -> list[str]:
    """The tasks whose adapter beat the base with the task's prompt on its headline row by more
    than noise moves it: twice the standard error of the difference, from a paired bootstrap where
    both ran on the same items, from the seeds otherwise. Where the two are within noise, the
    prompt alone, the simpler of the two, stays."""
    helped = []
    for task, (metric, test_set, higher_is_better) in HEADLINES.items():
        r = find_row(rows, task, metric, test_set)
        if r is None or r["adapter"] is None:
            continue
        if "difference_error" in r:  # paired: both on the same items
            gain = (r["adapter"] - r["base"]) * (1 if higher_is_better else -1)
            if gain > 2 * r["difference_error"]:
                helped.append(task)
        elif better_beyond_noise(r["adapter"], standard_error_of(r, "adapter"), r["base"],
                                 standard_error_of(r, "base"), higher_is_better):
            helped.append(task)
    return helped


def row(task: str, metric: str, test_set: str, n: int, values: dict[str, float],
        standard_errors: dict[str, float | None] | None = None, baselines: dict[str, float] | None = None,
        difference_error: float | None = None, items: dict | None = None) -> dict:
    """One line of the table; standard_errors (over seeds, or a bootstrap over the items) where
    the row has them; baselines: what answers with no model in them score on the same items;
    difference_error: the standard error of adapter minus base, where both ran on the same items;
    items: per_item's record, kept on the headline rows of the validation splits alone (where the
    shipping gate pairs two editions)."""
    r = {"task": task, "metric": metric, "test_set": test_set, "n": n,
         **{system: values.get(system) for system in SYSTEMS}}
    if standard_errors and any(e is not None for e in standard_errors.values()):
        r["standard_error"] = {system: standard_errors.get(system) for system in SYSTEMS}
    if baselines:
        r["baselines"] = baselines
    if difference_error is not None:
        r["difference_error"] = difference_error
    if items is not None and (task, metric, test_set) in HEADLINE_ROWS:
        r["per_item"] = items
    return r


def evaluate(model, tokenizer, data_dir: Path, limit: int = 0, bpb_chars: int = 0, split: str = "test",
             language_modelling: dict | None = None, lookup: TranslationLookup | None = None) -> list[dict]:
    """Every row of the table on `split` ("test", or "val": what decisions are made on), the
    baselines computed from the training split. limit: at most this many records per file
    (0 = all); translation takes at most `limit` per direction. language_modelling: the bits per
    byte row, where it was measured already (it reads the TinyStories validation text either way)."""
    def records(name: str, task: str) -> list[dict]:
        found = read_records(data_dir / name, task)
        if not limit:
            return found
        if task == "translate":
            kept, per_direction = [], {}
            for r in found:
                direction = (r["source"], r["target"])
                if per_direction.get(direction, 0) < limit:
                    kept.append(r)
                    per_direction[direction] = per_direction.get(direction, 0) + 1
            return kept
        return found[:limit]

    def systems(task: str) -> list[str]:
        return ["base", "adapter"] if TASKS[task].adapter in adapter_names(model) else ["base"]

    def train(task: str) -> list[dict]:
        return read_records(data_dir / f"{task}-train.jsonl", task)

    if language_modelling is None:
        text = tinystories_validation_text()
        bpb_chars = bpb_chars or limit * BPB_CHARS_PER_LIMIT
        text = text[:bpb_chars] if bpb_chars else text
        language_modelling = row(*LANGUAGE_MODELLING, len(text.encode("utf-8")),
                                 {"base": bits_per_byte(model, tokenizer, text, progress=True)})
    rows = [language_modelling]
    lookup = lookup or TranslationLookup(train("translate"))
    typical = typical_length([r["translation"] for r in lookup.train])
    rows += translation_rows(model, tokenizer, records(f"translate-{split}.jsonl", "translate"), systems("translate"),
                             lookup, typical)
    rows += translation_rows(model, tokenizer, records(f"translate-far-{split}.jsonl", "translate"),
                             systems("translate"), lookup, typical, FAR)
    summaries = records(f"summarize-{split}.jsonl", "summarize")
    if split == "test" and (data_dir / "summarize-derived-test.jsonl").is_file():
        summaries += records("summarize-derived-test.jsonl", "summarize")
    summary_train = train("summarize")
    for source, test_set in SUMMARY_SETS.items():
        chosen = [r for r in summaries if r.get("source", "aesop") == source]
        if chosen:
            rows += summarization_rows(model, tokenizer, chosen, test_set, systems("summarize"), summary_train)
    rows += dialogue_rows(model, tokenizer, records(f"dialogue-{split}.jsonl", "dialogue"), systems("dialogue"),
                          train("dialogue"))
    return rows


def below_baselines(rows: list[dict]) -> list[str]:
    """In plain words, each chrF or ROUGE-L score (the row's better system) that does not beat one
    of its baselines by more than its noise."""
    said = []
    for r in rows:
        if r["metric"] not in BASELINE_METRICS or not r.get("baselines"):
            continue
        best = max((s for s in SYSTEMS if r[s] is not None), key=lambda s: r[s])
        for name, value in r["baselines"].items():
            if not better_beyond_noise(r[best], standard_error_of(r, best), value, 0.0, True):
                said.append(f"{r['task']}, {r['test_set']}: the model's {r['metric']} {r[best]:.1f} "
                            f"(base + {SYSTEM_NAMES[best]}) does not beat the baseline \"{name}\", {value:.1f}")
    return said


def score_text(row: dict, system: str) -> str:
    """One system's score in a row as a table cell: a sampled score as its mean ± standard error."""
    value = row[system]
    if value is None:
        return "—"
    if "standard_error" in row:
        return f"{value:.2f} ± {standard_error_of(row, system):.2f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| task | metric | test set | n | base + prompt | base + adapter | baselines (no model) |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        baselines = " · ".join(f"{name} {value:.1f}" for name, value in r.get("baselines", {}).items()) or ""
        lines.append(f"| {r['task']} | {r['metric']} | {r['test_set']} | {r['n']:,} | {score_text(r, 'base')} | "
                     f"{score_text(r, 'adapter')} | {baselines} |")
    below = below_baselines(rows)
    if below:
        lines += ["", "Where the model does not beat an answer with no model in it:", "",
                  *(f"- {line}." for line in below)]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.eval", description=(
        "Evaluate a checkpoint on the held-out test splits written by `python -m train.data`: the base model "
        "with each task's prompt, and with the task's adapter where the checkpoint has one. Writes a markdown "
        "table and a JSON file with the same numbers."))
    p.add_argument("--model", default="bundled",
                   help="checkpoint directory, hub id such as gpt2, or 'bundled' (default); its adapters/ are used")
    p.add_argument("--adapters", type=Path, default=None,
                   help="also load the adapters in DIR/<task>/ (e.g. fresh ones from train.finetune), "
                        "replacing the checkpoint's own of the same name")
    p.add_argument("--data", type=Path, default=Path("runs/task-data"), help="directory of the {task}-test.jsonl files")
    p.add_argument("--out", type=Path, default=None,
                   help="markdown file to write (default docs/eval-<model name>.md); the JSON goes next to it")
    p.add_argument("--limit", type=int, default=0,
                   help="a quick run: at most N records per test set and per translation direction, and bits per "
                        f"byte on the first N x {BPB_CHARS_PER_LIMIT:,} characters of the validation text (0 = all)")
    p.add_argument("--bpb-chars", type=int, default=0,
                   help="measure bits per byte on the first N characters of the validation text "
                        "(0 = all of it, or what --limit says)")
    p.add_argument("--on-by-default", type=Path, default=None, metavar="ADAPTERS_DIR",
                   help="write ADAPTERS_DIR/on_by_default.json: the adapters that scored better than the "
                        "prompt alone, which the app then starts with (e.g. assets/adapters); not with --limit")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch (0 = torch's default); 1 is faster when another job shares the cores")
    args = p.parse_args(argv)
    if args.limit < 0 or args.bpb_chars < 0 or args.threads < 0:
        p.error("--limit, --bpb-chars and --threads cannot be negative")
    if args.on_by_default is not None and not args.on_by_default.is_dir():
        p.error(f"--on-by-default: {args.on_by_default} is not a directory of adapters")
    if args.on_by_default is not None and args.limit:
        p.error("--on-by-default takes the whole splits: a --limit run is too small to decide which adapters "
                "start on")
    if args.out is None:
        args.out = Path("docs") / f"eval-{Path(str(args.model)).name}.md"
    return args


def missing_prerequisite(data: Path) -> str | None:
    """What the evaluation needs and does not find, in one line with the command that makes it;
    None when all is there. Checked before any work, so a missing file costs no minutes."""
    validation = TINYSTORIES_DIR / "yuninxia_tinystories_val.txt"
    if not validation.is_file():
        return (f"the data folder is missing: no {validation} (the project's data is read from {DATA_DIR}; "
                "put the shared data there or set STUDIO_DATA_DIR to where it is)")
    missing = [name for name in TEST_FILES if not (data / name).is_file()]
    if missing:
        return (f"the task data is missing: no {', '.join(missing)} in {data}; make it with "
                f"`python -m train.data --out {data}`")
    return None


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    missing = missing_prerequisite(args.data)
    if missing:
        raise SystemExit(f"train.eval: {missing}")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        model, tokenizer = load_pretrained(args.model, device=pick_device(args.device))
    except (OSError, ValueError) as error:  # CheckpointError and friends: a message, not a traceback
        raise SystemExit(f"train.eval: could not load the model {args.model}: {error}") from None
    if args.adapters is not None:
        if not load_adapters(model, args.adapters):
            raise FileNotFoundError(f"no adapters (<task>/adapter_config.json) in {args.adapters}")
    # Decisions (which adapters start on, whether an edition ships) read the validation rows; the
    # test rows are for the card alone.
    lookup = TranslationLookup(read_records(args.data / "translate-train.jsonl", "translate"))  # indexed once
    validation_rows = evaluate(model, tokenizer, args.data, args.limit, args.bpb_chars, split="val", lookup=lookup)
    rows = evaluate(model, tokenizer, args.data, args.limit, args.bpb_chars, language_modelling=validation_rows[0],
                    lookup=lookup)
    for r in rows:  # the gate pairs editions on the validation items alone
        r.pop("per_item", None)
    minutes = (time.perf_counter() - started) / 60
    c = model.config
    command = " ".join(["python -m train.eval", f"--model {shown_path(args.model)}", f"--data {shown_path(args.data)}"]
                       + ([f"--adapters {shown_path(args.adapters)}"] if args.adapters else [])
                       + ([f"--limit {args.limit}"] if args.limit else [])
                       + ([f"--bpb-chars {args.bpb_chars}"] if args.bpb_chars else []))
    header = (f"# Evaluation of `{shown_path(args.model)}`\n\n"
              f"{model.num_parameters():,} parameters ({c.n_layer} layers, n_embd {c.n_embd}, "
              f"context {c.n_positions}), "
              f"{tokenizer.name} tokenizer ({tokenizer.vocab_size:,} tokens); adapters: "
              f"{', '.join(adapter_names(model)) or 'none'}. Held-out test splits made by `python -m train.data`. "
              "Generation uses each task's defaults through run_task, as its tab starts: translation greedy, "
              "summaries and replies sampled with each of the seeds "
              f"{', '.join(map(str, SEEDS))}, their scores the mean over the seeds ± its standard error (a greedy "
              "score's ± is a bootstrap over the items). "
              f"The rows \"{FAR}\" are sentences written for the purpose (train/far_from_training.tsv; for "
              "validation, others: train/far_from_training_val.tsv), each "
              f"source with no training source at a character-trigram similarity of {FAR_FROM_TRAINING} or more. "
              "A loop is an output that repeats a word 3-gram three times or runs past 2.5 times its reference "
              "(or the task's median training reference, where that is longer). chrF, BLEU and ROUGE are on a "
              "0-100 scale, higher is better; — means the checkpoint has no adapter for the task (bits per byte "
              f"is measured without adapters). Measured in {minutes:.1f} minutes with `{command}`.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    helped = adapters_that_help(validation_rows)
    decided = (f"\n\n## Decisions, on the validation splits\n\nWhich adapters the tabs start with is decided "
               f"on these rows, never on the test splits: an adapter starts on where it beats the prompt alone by "
               f"more than twice the standard error of the difference. On: {', '.join(helped) or 'none'}.")
    text = markdown(rows, header) + markdown(validation_rows, decided)
    args.out.write_text(text, encoding="utf-8")
    numbers = {"model": shown_path(args.model), "seeds": list(SEEDS), "limit": args.limit, "rows": rows,
               "validation_rows": validation_rows, "adapters_that_help": helped}
    args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=2), encoding="utf-8")
    if args.on_by_default is not None:
        write_on_by_default(args.on_by_default, numbers["adapters_that_help"])
    print(text)
    return rows


if __name__ == "__main__":
    main()

"""Write the bundled model's card, assets/README.md, from what the project measured.

    python scripts/model_card.py [--eval docs/eval-bundled.json]   # after a change to the shipped files or defaults
    python scripts/model_card.py --training-time "1.5 hours" --notes "..."  # a new edition (build_bundled.sh)

The pretraining run's arguments and log are read from docs/training/, where build_bundled.sh
copies them. Without --training-time, --hardware or --notes, the card keeps the ones it has.

The samples are generated here, from the shipped files in assets/, with the seeds and settings
the card states; they are also written to assets/samples.json, which tests/test_bundled.py
replays to check that the card shows what the shipped model really writes.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import cpu_name  # noqa: E402
from engine import kernels, prepare_for_serving  # noqa: E402
from model import load_pretrained  # noqa: E402
from model.adapters import adapters_on_by_default  # noqa: E402
from model.checkpoint import BUNDLED_DIR  # noqa: E402
from serve.outcome import STOP_REASON_WORDS  # noqa: E402
from tasks import TASKS, DialogueInputs, GenerateInputs, SummarizeInputs, TaskDone, TranslateInputs, run_task  # noqa: E402
from tasks.dialogue import PERSONAS  # noqa: E402
from train.eval import (GENERALISATION, HEADLINES, LANGUAGE_MODELLING, SYSTEMS, find_row,  # noqa: E402
                        paired_difference_error, score_text, seed_noise, standard_error_of)
from train.pretrain import PRETRAIN_SOURCES, TRAINING_RECORD  # noqa: E402

SAMPLE_SEED = 1234
SAMPLE_INPUTS = {
    "generate": [GenerateInputs("Once upon a time, there was a little fox who"),
                 GenerateInputs("The old king called his three sons and said")],
    "dialogue": [DialogueInputs("Hi! Can I get a large latte, please?", persona=PERSONAS["taskmaster"]),
                 DialogueInputs("Do you like to read books?")],
    "translate": [TranslateInputs("I like to read books.", "English", "French"),
                  TranslateInputs("Where is the train station?", "English", "German")],
    "summarize": [SummarizeInputs(
        "A Dog, to whom the butcher had thrown a bone, was hurrying home with his prize as fast as he could go. "
        "As he crossed a narrow footbridge, he happened to look down and saw himself reflected in the quiet water "
        "as if in a mirror. But the greedy Dog thought he saw a real Dog carrying a bone much bigger than his own. "
        "He opened his mouth to snatch it, and his own bone fell into the water and was lost.")],
}


def make_samples(model, tokenizer) -> list[dict]:
    samples = []
    for task_name, inputs_list in SAMPLE_INPUTS.items():
        task = TASKS[task_name]
        for inputs in inputs_list:
            for adapter_on in ([False, True] if task.adapter else [False]):
                params = replace(task.defaults, seed=SAMPLE_SEED)
                done = next(e for e in run_task(task, model, tokenizer, inputs, params, adapter_on)
                            if isinstance(e, TaskDone))
                samples.append({"task": task_name, "inputs": asdict(inputs), "adapter": adapter_on,
                                "seed": SAMPLE_SEED, "prompt": done.prompt.text, "output": done.text,
                                "stop_reason": done.result.stop_reason})
    return samples


def train_command(train_args: dict) -> str:
    flags = ["tokenizer", "n_layer", "n_embd", "n_head", "block_size", "batch_size", "max_steps", "warmup_steps", "lr",
             "seed"]
    mix = " ".join(f"{name}={share:g}" for name, share in train_args["mix"])
    return "python -m train.pretrain --out runs/bundled " + " ".join(
        f"--{name.replace('_', '-')} {train_args[name]}" for name in flags) + f" --mix {mix}"


def headline_changes(before: dict, now: dict) -> tuple[list[str], list[str]]:
    """(worse, better): where `now` is worse, and where it is better, than `before` on bits per byte,
    on each task's headline row of the validation splits (train.eval.HEADLINES) and on the
    generalisation row (train.eval.GENERALISATION), by its better system (prompt or adapter:
    what a user can get), by more than noise moves it: twice the standard error of the difference
    from a bootstrap over the items where both evaluations kept them (train.eval's per_item: the two
    on the same items), else from the seeds (a mean over seeds has a standard error; an exact or
    greedy score, or one from a single seed, counts as exact)."""
    def best(evaluation, task, metric, test_set, pick):
        r = find_row(evaluation["validation_rows"], task, metric, test_set)  # never the test rows
        systems = [s for s in SYSTEMS if r and r[s] is not None]
        if not systems:
            return None
        system = pick(systems, key=lambda s: r[s])
        return r[system], standard_error_of(r, system), r, system

    worse, better = [], []
    checks = [(*LANGUAGE_MODELLING, False), *((task, *rest) for task, rest in HEADLINES.items()), GENERALISATION]
    for task, metric, test_set, higher_is_better in checks:
        pick = max if higher_is_better else min
        earlier, latest = best(before, task, metric, test_set, pick), best(now, task, metric, test_set, pick)
        if earlier is None:
            print(f"{task}: the earlier evaluation has no {metric} row to compare with")
            continue
        if latest is None:
            worse.append(f"{task}, {metric}, {test_set}: no such row now, {earlier[0]:.3f} before")
            continue
        (old, old_error, old_row, old_system), (new, new_error, new_row, new_system) = earlier, latest
        paired = paired_difference_error(new_row, new_system, old_row, old_system)
        slack = 2 * paired if paired is not None else seed_noise(old_error, new_error)
        gain = (new - old) * (1 if higher_is_better else -1)
        change = f"{task}, {metric}, {test_set}: {new:.3f} now, {old:.3f} before"
        moved_by = "a bootstrap over the same items" if paired is not None else "the seeds"
        noise = f" (beyond the {slack:.2f} that {moved_by} can move it)" if slack else ""
        if -gain > slack:
            worse.append(change + noise)
        elif gain > slack:
            better.append(change + noise)
    return worse, better


def before_and_now(before: dict, now: dict) -> str:
    """The headline rows of two evaluations side by side (those both have)."""
    earlier = {(r["task"], r["metric"], r["test_set"]): r for r in before["rows"]}
    lines = ["| task | metric | test set | before: base | before: adapter | now: base | now: adapter |",
             "|---|---|---|---:|---:|---:|---:|"]

    for r in now["rows"]:
        old = earlier.get((r["task"], r["metric"], r["test_set"]))
        if old is None or r["metric"] == "BLEU":
            continue
        cells = [score_text(row, system) for row in (old, r) for system in SYSTEMS]
        lines.append(f"| {r['task']} | {r['metric']} | {r['test_set']} | {' | '.join(cells)} |")
    return "\n".join(lines)


TRAINING_ROW = re.compile(r"^\| training time \| (?P<training_time>.+) on (?P<hardware>.+) \(pretraining\), ", re.M)
NOTES_AFTER = "adds the new run's tokens to the count above).\n"


def card_as_it_is() -> dict[str, str]:
    """The training time, hardware and notes of the card shipped now: what a card rewritten for
    the same weights keeps."""
    path = BUNDLED_DIR / "README.md"
    text = path.read_text() if path.is_file() else ""
    found = TRAINING_ROW.search(text)
    kept = found.groupdict() if found else {}
    if NOTES_AFTER in text:
        kept["notes"] = text.split(NOTES_AFTER, 1)[1].strip()
    return kept


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-records", type=Path, default=REPO / "docs" / "training",
                   help="the pretraining run's pretrain-args.json and pretrain-log.jsonl")
    p.add_argument("--eval", type=Path, default=REPO / "docs" / "eval-bundled.json", help="train.eval's JSON")
    p.add_argument("--before", type=Path, default=REPO / "docs" / "training" / "eval-previous.json",
                   help="train.eval's JSON of the model this one replaces (build_bundled.sh keeps it there), "
                        "for the now-and-before table")
    p.add_argument("--sweep", type=Path, default=REPO / "docs" / "training" / "size-sweep.md",
                   help="the size sweep's table (scripts/size_sweep.py)")
    p.add_argument("--hardware", default=None,
                   help=f"what the model was trained on (default: as the card says, else {cpu_name()}, 2 cores, "
                        "no GPU)")
    p.add_argument("--check-improves", action="store_true",
                   help="only say whether --eval improves on --before: better on bits per byte or a task's "
                        "best headline and worse on none, beyond noise (a bootstrap over the same validation items "
                        "where both kept them, else the seeds' standard errors); exit 1 if not")
    p.add_argument("--training-time", required=False, help='wall-clock pretraining time, e.g. "1.4 hours"')
    p.add_argument("--notes", default=None, help="anything about the run the logs do not say (a resume, a change)")
    args = p.parse_args(argv)
    if args.check_improves:
        worse, better = headline_changes(json.loads(args.before.read_text()), json.loads(args.eval.read_text()))
        print("\n".join([*(f"worse: {line}" for line in worse), *(f"better: {line}" for line in better)]
                        or [f"{args.eval} is neither better nor worse than {args.before}"]))
        raise SystemExit(0 if better and not worse else 1)
    kept = card_as_it_is()
    args.training_time = args.training_time or kept.get("training_time")
    args.hardware = args.hardware or kept.get("hardware") or f"{cpu_name()}, 2 cores, no GPU"
    args.notes = kept.get("notes", "") if args.notes is None else args.notes
    if not args.training_time:
        p.error("--training-time is needed to write the card")

    started = time.perf_counter()
    model, tokenizer = load_pretrained(BUNDLED_DIR)  # the weights, the tokenizer and the three adapters
    load_seconds = time.perf_counter() - started
    prepare_for_serving(model)  # the samples are what the app writes: on the decode kernels where they build
    kernels.wait_until_built()
    train_args = json.loads((args.train_records / "pretrain-args.json").read_text())
    log = [json.loads(line) for line in (args.train_records / "pretrain-log.jsonl").read_text().splitlines()]
    final = [r for r in log if "val_loss" in r][-1]
    evaluation = json.loads(args.eval.read_text())
    bpb = find_row(evaluation["rows"], *LANGUAGE_MODELLING)["base"]
    training = json.loads((BUNDLED_DIR / TRAINING_RECORD).read_text())
    tokens_seen = training["tokens_seen"]
    this_run = training["runs"][-1]
    mix = ", ".join(f"{share:.0%} {PRETRAIN_SOURCES[name]}" for name, share in this_run["mix"].items())
    before = json.loads(args.before.read_text())
    before_table = args.before.with_suffix(".md").resolve()
    if not before_table.is_file():
        p.error(f"{before_table} is missing: the card links the replaced model's evaluation table")
    before_path = before_table.relative_to(REPO) if before_table.is_relative_to(REPO) else before_table.name
    sweep = args.sweep.read_text().strip()
    c = model.config

    samples = make_samples(model, tokenizer)
    (BUNDLED_DIR / "samples.json").write_text(json.dumps(samples, indent=2, ensure_ascii=False) + "\n")

    eval_table = (args.eval.with_suffix(".md")).read_text().split("\n", 2)[2]
    sample_md = []
    for s in samples:
        setting = f"adapter {'on' if s['adapter'] else 'off'}" if TASKS[s["task"]].adapter else "no adapter"
        sample_md.append(f"**{s['task']}**, {setting}, seed {s['seed']}, the task's default settings "
                         f"(stopped: {STOP_REASON_WORDS[s['stop_reason']]})\n\n```text\n{s['prompt']}\n```\n\n"
                         f"→\n\n```text\n{s['output']}\n```\n")

    on_by_default = ", ".join(adapters_on_by_default(model)) or "none"  # what assets/adapters ships
    card = f"""---
license: mit
language: [en, fr, de]
library_name: pre-ln-gpt2-studio
tags: [gpt2, pre-ln, tiny, lora]
---

# Pre-LN GPT-2 Studio: the bundled model

A small GPT-2 with Pre-Layer Normalization, trained from scratch by this project on open data so
that the app works offline, with a LoRA adapter for each of dialogue, translation and
summarisation. Its pretraining already carries the tabs' own formats (translation pairs, chat
transcripts, TL;DR summaries) next to children's stories and books. It is a toy next to GPT-2
(124M parameters, 40 GB of web text): expect simple English, short everyday translations and
adapters that know their task's format better than its substance. Everything here is
reproducible with the commands below.

## Configuration

| | |
|---|---|
| architecture | GPT-2, Pre-LN blocks, final LayerNorm, tied output head |
| parameters | {model.num_parameters():,} |
| layers / width / heads | {c.n_layer} / {c.n_embd} / {c.n_head} |
| context | {c.n_positions} tokens |
| tokenizer | SentencePiece BPE, {tokenizer.vocab_size:,} pieces, byte fallback, every English, French and German letter a piece of its own (`tokenizer.model`) |
| tokens seen | {tokens_seen:,} in {len(training['runs'])} pretraining run{'s' if len(training['runs']) > 1 else ''} (this one: {this_run['steps']:,} steps × {train_args['batch_size']} sequences × {train_args['block_size']} tokens) |
| training time | {args.training_time} on {args.hardware} (pretraining), {'bf16 autocast' if this_run['bf16'] else 'fp32'} |
| optimiser | AdamW (β 0.9/0.95, weight decay {train_args['weight_decay']}), peak lr {train_args['lr']}, {train_args['warmup_steps']} warmup steps, cosine to {train_args['min_lr_ratio']}×, gradient clipping {train_args['grad_clip']}, seed {train_args['seed']} |
| data mix | {mix}; rows of each batch drawn by these shares |
| adapters on by default | {on_by_default} (those whose evaluation below beats the prompt alone by more than seeds move it) |

## How the size was chosen

{sweep}

## Results

Validation loss (nats per token) at the end of pretraining: {final['val_loss']:.3f} overall,
{final['val_tinystories']:.3f} on held-out TinyStories stories, {final['val_gutenberg']:.3f} on the two
held-out Gutenberg books. **Bits per byte on the TinyStories validation split
(`yuninxia_tinystories_val.txt`, never trained on): {bpb:.3f}.**

Now against the model this one replaces (its card's evaluation; `{before_path}`):

{before_and_now(before, evaluation)}

Loading takes {load_seconds:.2f} s on the machine above (`load_pretrained()` with no path: the
weights, the tokenizer and the three adapters, offline), on top of about 2 s for Python to import
torch and transformers.

{eval_table}
## Data and licenses

- Pretraining prose: 43 public-domain children's classics from Project Gutenberg (headers and
  footers stripped; *Tik-Tok of Oz* and *The Happy Prince and Other Tales* held out for
  validation), and TinyStories (Eldan and Li, 2023; CDLA-Sharing-1.0): the normal-cased file,
  less its last 10% held out, plus the lowercased file's stories that are not in it, with their
  casing restored by a truecaser learned from the normal-cased stories (see `train/corpus.py`).
- The task formats in pretraining and the adapters come from the training splits of the task
  sets below (`train/data.py`; `train.data.pretraining_documents` for the pretraining text);
  their test and validation splits were cut first and never trained on.
- Translation: Tatoeba English-French and English-German sentence pairs (Tatoeba.org, CC BY 2.0
  FR), both directions. The generalisation rows ("new sentences far from training") are 148
  sentences written by this project in all three languages (`train/far_from_training.tsv`; on
  validation, 48 others: `train/far_from_training_val.tsv`), each used as a source only where no
  training source comes within a character-trigram similarity of 0.5; never trained on.
- Dialogue: Topical-Chat (Amazon, CDLA-Sharing-1.0), Schema-Guided Dialogue (Google,
  CC BY-SA 4.0), Taskmaster-4 (Byrne and Ganesh, Google, CC BY 4.0), chatterbot-corpus
  (BSD-3-Clause).
- Summarisation: *The Aesop for Children* (1919, Library of Congress, public domain),
  fable -> lesson, plus pairs derived by this project from Schema-Guided Dialogue: the dialogue's
  transcript as the article and a one-line summary built from the services it uses (true by
  construction, but it names topics only; see `train/data.py`).

## Samples

Unedited output of the files in this folder, regenerated by `python scripts/model_card.py` and
checked by `tests/test_bundled.py` against `samples.json`.

{chr(10).join(sample_md)}
## Reproduce

```bash
python scripts/train_tokenizer.py --out runs/tok/tokenizer
{train_command(train_args)}
bash scripts/build_bundled.sh "TRAINING TIME"   # task data, adapters, evaluation, this card
```

Later sessions continue this model rather than start again:
`python -m train.pretrain --init bundled --out runs/bundled --minutes 120` (a fresh warm-up and
schedule; `training.json` adds the new run's tokens to the count above).

{args.notes}
"""
    (BUNDLED_DIR / "README.md").write_text(card)
    print(f"wrote {BUNDLED_DIR / 'README.md'}")


if __name__ == "__main__":
    main()

"""Evaluate a checkpoint on the held-out test splits, prompting the base model and with each task's adapter.

    python -m tasks.data --out runs/task-data      # once: the held-out splits (needs ../shared/data)
    python -m tasks.eval --model bundled --data runs/task-data --out docs/eval-bundled.md \
        --on-by-default assets/adapters      # and let the result pick the adapters the tabs start with
    python -m tasks.eval --model bundled --limit 5  # a quick run: 5 examples a test set, a short text

Writes a markdown table and a JSON file with the same numbers (same name, .json):
- bits per byte of the TinyStories validation text (train.metrics.bits_per_byte): the base model
  only, since no adapter is on when the app generates freely;
- translation: chrF and BLEU (sacrebleu, corpus level) per direction and over all directions;
- summarisation: ROUGE-1/2/L F1 (rouge-score, Porter stemming), mean over the Aesop fables, and
  apart from them over the derived dialogue summaries when that test file is there;
- dialogue: per-token loss (nats) of the held-out responses given their transcripts, teacher
  forced, which needs no sampling and so no seed.
Generation goes through run_task with each task's own defaults, as the app runs it: the base
with the GPT-2 paper's prompt (translation: four example pairs and greedy decoding; summary:
`TL;DR:`, top-k 2, the first 3 sentences of at most 100 tokens), the adapter with the format it
was trained on. Summarisation samples, so it is generated once with each of SEEDS and scored as
the mean over them, with its standard error: on 30 fables one seed's ROUGE-L spans about 4 points
over five seeds, more than an adapter gains. Fixed seeds make a run repeat exactly.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import sacrebleu
import torch
from rouge_score import rouge_scorer
from tqdm import tqdm

from model.adapters import active_adapter, adapter_names, load_adapters, write_on_by_default
from model.checkpoint import load_pretrained, pick_device
from train.corpus import DATA_DIR, TINYSTORIES_DIR, tinystories_validation_text
from train.metrics import bits_per_byte

from . import TASKS, TaskDone, run_task
from .data import example_from_record, read_records
from .finetune import completion_nll, encode_records, shown_path

SEEDS = (0, 1, 2, 3, 4)  # summarisation samples, so it runs once with each; greedy translation once
TEST_FILES = ("translate-test.jsonl", "summarize-test.jsonl", "dialogue-test.jsonl")
BPB_CHARS_PER_LIMIT = 2000  # with --limit N, bits per byte over the first N * this many characters
SYSTEMS = ("base", "adapter")  # the base model with the task's prompt; the same base with the task's adapter


def generate_all(task_name: str, model, tokenizer, records: list[dict], adapter_on: bool,
                 seed: int = SEEDS[0]) -> list[str]:
    """What the app would show for each record's inputs, sampled with `seed`."""
    task = TASKS[task_name]
    params = replace(task.defaults, seed=seed)
    outputs = []
    label = f"{task_name} ({'adapter' if adapter_on else 'base'}, seed {seed})"
    for record in tqdm(records, desc=label, leave=False, dynamic_ncols=True):
        inputs, _ = example_from_record(task_name, record)
        done = next(e for e in run_task(task, model, tokenizer, inputs, params, adapter_on) if isinstance(e, TaskDone))
        outputs.append(done.text)
    return outputs


def translation_rows(model, tokenizer, records: list[dict], systems: list[str]) -> list[dict]:
    # One run, with no standard error, holds only while translation decodes greedily.
    assert TASKS["translate"].defaults.greedy, "translation samples now: score it over SEEDS as summarisation is"
    outputs = {system: generate_all("translate", model, tokenizer, records, system == "adapter") for system in systems}
    groups = {}
    for i, r in enumerate(records):
        groups.setdefault(f"{r['source']}->{r['target']}", []).append(i)
    groups = {**dict(sorted(groups.items())), "all directions": list(range(len(records)))}
    rows = []
    for name, chosen in groups.items():
        references = [[records[i]["translation"] for i in chosen]]
        for metric, score in (("chrF", sacrebleu.corpus_chrf), ("BLEU", sacrebleu.corpus_bleu)):
            values = {system: score([outputs[system][i] for i in chosen], references).score for system in systems}
            rows.append(row("translate", metric, f"Tatoeba {name}", len(chosen), values))
    return rows


def summarization_rows(model, tokenizer, records: list[dict], test_set: str, systems: list[str]) -> list[dict]:
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    keys = ("rouge1", "rouge2", "rougeL")
    per_seed = {system: {key: [] for key in keys} for system in systems}  # one mean over the records a seed
    for system in systems:
        for seed in SEEDS:
            outputs = generate_all("summarize", model, tokenizer, records, system == "adapter", seed)
            scores = [scorer.score(r["summary"], output) for r, output in zip(records, outputs)]
            for key in keys:
                per_seed[system][key].append(100 * sum(s[key].fmeasure for s in scores) / len(records))
    return [row("summarize", f"ROUGE-{key[5:]} F1", test_set, len(records),
                {system: statistics.mean(per_seed[system][key]) for system in systems},
                {system: standard_error(per_seed[system][key]) for system in systems})
            for key in keys]


def standard_error(values: list[float]) -> float | None:
    """Of the mean of `values` (one score per seed); None for a single value, which has none."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def dialogue_rows(model, tokenizer, records: list[dict], systems: list[str]) -> list[dict]:
    examples = encode_records("dialogue", records, tokenizer, model.config.n_positions).examples
    # Bits per byte as well as nats per token: a byte count does not depend on the tokenizer, so
    # models with different vocabularies compare.
    response_bytes = sum(len(tokenizer.decode(e.ids[e.prompt_tokens:]).encode("utf-8")) for e in examples)
    per_token, per_byte = {}, {}
    for system in systems:
        with active_adapter(TASKS["dialogue"].adapter if system == "adapter" else None):
            total, count = completion_nll(model, examples, tokenizer.eos_id)
        per_token[system], per_byte[system] = total / count, total / math.log(2) / response_bytes
    return [row("dialogue", "response loss (nats/token, lower is better)", "held-out responses", len(examples),
                per_token),
            row("dialogue", "response loss (bits per byte, lower is better)", "held-out responses", len(examples),
                per_byte)]


# The base model's own row (task, metric, test set): it has no adapter, and lower is better.
LANGUAGE_MODELLING = ("language modelling", "bits per byte (lower is better)", "TinyStories validation (n in bytes)")
# Per task, the row that says whether its adapter beats the prompt alone, and whether higher is better.
HEADLINES = {
    "translate": ("chrF", "Tatoeba all directions", True),
    "summarize": ("ROUGE-L F1", "Aesop fable -> lesson", True),
    "dialogue": ("response loss (bits per byte, lower is better)", "held-out responses", False),
}


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
    """The tasks whose adapter beat the base with the task's prompt on its headline row, by more
    than seeds alone move it: where the two are within noise, the prompt alone, the simpler of
    the two, stays."""
    helped = []
    for task, (metric, test_set, higher_is_better) in HEADLINES.items():
        r = find_row(rows, task, metric, test_set)
        if r is None or r["adapter"] is None:
            continue
        if better_beyond_noise(r["adapter"], standard_error_of(r, "adapter"), r["base"], standard_error_of(r, "base"),
                               higher_is_better):
            helped.append(task)
    return helped


def row(task: str, metric: str, test_set: str, n: int, values: dict[str, float],
        standard_errors: dict[str, float | None] | None = None) -> dict:
    """One line of the table; standard_errors (over seeds) only for a sampled metric."""
    r = {"task": task, "metric": metric, "test_set": test_set, "n": n,
         **{system: values.get(system) for system in SYSTEMS}}
    if standard_errors and any(e is not None for e in standard_errors.values()):
        r["standard_error"] = {system: standard_errors.get(system) for system in SYSTEMS}
    return r


def evaluate(model, tokenizer, data_dir: Path, limit: int = 0, bpb_chars: int = 0) -> list[dict]:
    """Every row of the table. limit: at most this many records per test file (0 = all); translation
    takes at most `limit` per direction."""
    def test_records(name: str, task: str) -> list[dict]:
        records = read_records(data_dir / name, task)
        if not limit:
            return records
        if task == "translate":
            kept, per_direction = [], {}
            for r in records:
                direction = (r["source"], r["target"])
                if per_direction.get(direction, 0) < limit:
                    kept.append(r)
                    per_direction[direction] = per_direction.get(direction, 0) + 1
            return kept
        return records[:limit]

    def systems(task: str) -> list[str]:
        return ["base", "adapter"] if TASKS[task].adapter in adapter_names(model) else ["base"]

    text = tinystories_validation_text()
    bpb_chars = bpb_chars or limit * BPB_CHARS_PER_LIMIT
    text = text[:bpb_chars] if bpb_chars else text
    rows = [row(*LANGUAGE_MODELLING, len(text.encode("utf-8")),
                {"base": bits_per_byte(model, tokenizer, text, progress=True)})]
    rows += translation_rows(model, tokenizer, test_records("translate-test.jsonl", "translate"), systems("translate"))
    rows += summarization_rows(model, tokenizer, test_records("summarize-test.jsonl", "summarize"),
                               "Aesop fable -> lesson", systems("summarize"))
    if (data_dir / "summarize-derived-test.jsonl").is_file():
        rows += summarization_rows(model, tokenizer, test_records("summarize-derived-test.jsonl", "summarize"),
                                   "derived: SGD dialogue -> services", systems("summarize"))
    rows += dialogue_rows(model, tokenizer, test_records("dialogue-test.jsonl", "dialogue"), systems("dialogue"))
    return rows


def score_text(row: dict, system: str) -> str:
    """One system's score in a row as a table cell: a sampled score as its mean ± standard error."""
    value = row[system]
    if value is None:
        return "—"
    if "standard_error" in row:
        return f"{value:.2f} ± {standard_error_of(row, system):.2f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| task | metric | test set | n | base + prompt | base + adapter |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['metric']} | {r['test_set']} | {r['n']:,} | {score_text(r, 'base')} | "
                     f"{score_text(r, 'adapter')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tasks.eval", description=(
        "Evaluate a checkpoint on the held-out test splits written by `python -m tasks.data`: the base model "
        "with each task's prompt, and with the task's adapter where the checkpoint has one. Writes a markdown "
        "table and a JSON file with the same numbers."))
    p.add_argument("--model", default="bundled",
                   help="checkpoint directory, hub id such as gpt2, or 'bundled' (default); its adapters/ are used")
    p.add_argument("--adapters", type=Path, default=None,
                   help="also load the adapters in DIR/<task>/ (e.g. fresh ones from tasks.finetune), "
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
        p.error("--on-by-default takes the whole test sets: a --limit run is too small to decide which adapters "
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
                f"`python -m tasks.data --out {data}`")
    return None


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    missing = missing_prerequisite(args.data)
    if missing:
        raise SystemExit(f"tasks.eval: {missing}")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    try:
        model, tokenizer = load_pretrained(args.model, device=pick_device(args.device))
    except (OSError, ValueError) as error:  # CheckpointError and friends: a message, not a traceback
        raise SystemExit(f"tasks.eval: could not load the model {args.model}: {error}") from None
    if args.adapters is not None:
        if not load_adapters(model, args.adapters):
            raise FileNotFoundError(f"no adapters (<task>/adapter_config.json) in {args.adapters}")
    rows = evaluate(model, tokenizer, args.data, args.limit, args.bpb_chars)
    minutes = (time.perf_counter() - started) / 60
    c = model.config
    command = " ".join(["python -m tasks.eval", f"--model {shown_path(args.model)}", f"--data {shown_path(args.data)}"]
                       + ([f"--adapters {shown_path(args.adapters)}"] if args.adapters else [])
                       + ([f"--limit {args.limit}"] if args.limit else [])
                       + ([f"--bpb-chars {args.bpb_chars}"] if args.bpb_chars else []))
    header = (f"# Evaluation of `{shown_path(args.model)}`\n\n"
              f"{model.num_parameters():,} parameters ({c.n_layer} layers, n_embd {c.n_embd}, "
              f"context {c.n_positions}), "
              f"{tokenizer.name} tokenizer ({tokenizer.vocab_size:,} tokens); adapters: "
              f"{', '.join(adapter_names(model)) or 'none'}. Held-out test splits made by `python -m tasks.data`. "
              "Generation uses each task's defaults through run_task: translation greedy, summarisation top-k 2 "
              f"(first 3 sentences of at most 100 tokens), sampled with each of the seeds {', '.join(map(str, SEEDS))}: "
              "its scores are the mean over the seeds ± their standard error. chrF, BLEU and ROUGE are on a "
              "0-100 scale, higher is better; — means the checkpoint has no adapter for the task (bits per byte "
              f"is measured without adapters). Measured in {minutes:.1f} minutes with `{command}`.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(rows, header), encoding="utf-8")
    numbers = {"model": shown_path(args.model), "seeds": list(SEEDS), "limit": args.limit, "rows": rows,
               "adapters_that_help": adapters_that_help(rows)}
    args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=2), encoding="utf-8")
    if args.on_by_default is not None:
        write_on_by_default(args.on_by_default, numbers["adapters_that_help"])
    print(markdown(rows, header))
    return rows


if __name__ == "__main__":
    main()

"""Task data splits, adapter fine-tuning and evaluation, end to end on the real data and a tiny model."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from peft import PeftModel
from transformers import GPT2LMHeadModel

from model import GPT2, GPT2Config, load_pretrained, save_pretrained
from model.adapters import active_adapter, adapters_on_by_default, load_adapter
from train.corpus import tinystories_validation_text
from train.metrics import bits_per_byte
from model.tokenizer import SentencePieceTokenizer
from tasks import TASKS
from train import data, eval as task_eval, finetune

from .conftest import REPO, make_hf_checkpoint, make_lora_adapter

pytestmark = pytest.mark.slow  # fine-tuning and evaluation on the real splits

TEXT = "Once upon a time, a little fox found a shiny stone. She showed it to her friend, the owl, who smiled."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small run fastest on one thread, and much faster when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    return SentencePieceTokenizer.from_file(REPO / "assets" / "tokenizer.model")


def tiny_model(tokenizer, n_positions=128, seed=0) -> GPT2:
    torch.manual_seed(seed)
    model = GPT2(GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=n_positions, n_embd=32, n_layer=2,
                            n_head=2, eos_token_id=tokenizer.eos_id))
    # GPT-2's initialisation (std 0.02) gives a random model logits so near zero that LoRA on the
    # projections can hardly sharpen them through the tied head; a 10x wider embedding lets a few
    # LoRA steps show learning.
    with torch.no_grad():
        model.transformer.wte.weight.mul_(10)
    return model.eval()


@pytest.fixture(scope="module")
def tiny_base(tokenizer, tmp_path_factory) -> Path:
    """A random tiny Pre-LN GPT-2 with the bundled SentencePiece tokenizer, saved in HF layout."""
    return save_pretrained(tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("tiny-base"))


def ids_of(records, strip_turn=False):
    return {r["id"].split("#")[0] if strip_turn else r["id"] for r in records}


def chatterbot_openings(records) -> set[str]:
    return {r["message"] for r in records if r["id"].startswith("chatterbot") and not r["history"]}


def test_dialogue_split_is_by_conversation(task_splits):
    s = task_splits["dialogue"]
    assert len(s["test"]) == data.DIALOGUE_TEST * len(data.PERSONAS)
    conversations = {name: ids_of(records, strip_turn=True) for name, records in s.items()}
    assert not conversations["test"] & conversations["train"] and not conversations["val"] & conversations["train"]
    assert not conversations["test"] & conversations["val"]
    # Chatterbot conversations that open alike are one unit: no held-out opening line is trained on.
    assert chatterbot_openings(s["test"]) and not chatterbot_openings(s["test"]) & chatterbot_openings(s["train"])
    for r in s["test"]:
        assert len(r["history"]) <= data.HISTORY_PAIRS and all(len(pair) == 2 for pair in r["history"])


def test_translation_split_shares_no_sentence(task_splits):
    s = task_splits["translate"]
    sentences = {name: {r["text"] for r in records} | {r["translation"] for r in records}
                 for name, records in s.items()}
    assert not sentences["test"] & sentences["train"] and not sentences["val"] & sentences["train"]
    directions = {(r["source"], r["target"]) for r in s["train"]}
    assert directions == {("English", "French"), ("French", "English"), ("English", "German"), ("German", "English")}
    for source, target in directions:
        assert sum((r["source"], r["target"]) == (source, target) for r in s["test"]) == data.TRANSLATE_TEST


def test_summarization_test_is_aesop_only_and_held_out(task_splits):
    s = task_splits["summarize"]
    assert len(s["test"]) == data.AESOP_TEST and {r["source"] for r in s["test"]} == {"aesop"}
    assert len(s["derived-test"]) == data.DERIVED_TEST and {r["source"] for r in s["derived-test"]} == {"sgd-derived"}
    assert {r["source"] for r in s["train"]} == {"aesop", "sgd-derived"}
    held_out = ids_of(s["test"]) | ids_of(s["derived-test"]) | ids_of(s["val"])
    assert not held_out & ids_of(s["train"])
    assert not {r["article"] for r in s["test"]} & {r["article"] for r in s["train"]}
    assert s["derived-test"][0]["summary"].startswith("The user asks the assistant for help with ")


def test_splits_are_deterministic(task_splits):
    assert data.summarize_splits() == task_splits["summarize"]
    # Units are ordered by a hash of their key alone, so reading the data in another order changes nothing.
    units = data.aesop_units()
    forward = data.split_units(units, test={"aesop": 30}, val={"aesop": 10})
    assert data.split_units(list(reversed(units)), test={"aesop": 30}, val={"aesop": 10}) == forward


def test_read_records_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"article": "A fox.", "summary": "Foxes."}\n{"article": "No summary."}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a summarize record .*'summary'"):
        data.read_records(path, "summarize")


def write_jsonl(path: Path, records) -> Path:
    data.write_records(path, records)
    return path


def test_training_pairs_score_only_the_completion(task_splits, tokenizer):
    model = tiny_model(tokenizer, n_positions=64)
    records = task_splits["dialogue"]["test"][:3]
    encoded = finetune.encode_records("dialogue", records, tokenizer, n_ctx=64)
    expected_nats, expected_count = 0.0, 0
    for record, example in zip(records, encoded.examples):
        prompt, completion = TASKS["dialogue"].format_example(*data.example_from_record("dialogue", record))
        completion_ids = tokenizer.encode(completion)
        # The completion is whole; the prompt keeps its newest tokens, as many as fit the context.
        assert example.ids[example.prompt_tokens:] == completion_ids and len(example.ids) <= 64 + 1
        assert example.ids[:example.prompt_tokens] == tokenizer.encode(prompt)[-example.prompt_tokens:]
        ids = torch.tensor([example.ids])
        with torch.no_grad():
            log_probs = F.log_softmax(model(ids[:, :-1])[0], dim=-1)
        for t in range(example.prompt_tokens, len(example.ids)):
            expected_nats -= log_probs[t - 1, example.ids[t]].item()
        expected_count += len(completion_ids)
    assert encoded.truncated >= 1  # dialogue transcripts are longer than 64 tokens
    nats, count = finetune.completion_nll(model, encoded.examples, pad_id=tokenizer.eos_id)  # one padded batch
    assert count == expected_count and nats == pytest.approx(expected_nats, rel=1e-5)


def test_finetune_learns_and_saves_a_loadable_adapter(task_splits, tiny_base, tmp_path):
    records = write_jsonl(tmp_path / "train.jsonl", task_splits["translate"]["train"][:24])
    out = tmp_path / "adapter"
    logged = finetune.main(["--task", "translate", "--data", str(records), "--val", str(records), "--out", str(out),
                            "--base", str(tiny_base), "--steps", "30", "--batch-size", "8", "--lr", "3e-2",
                            "--warmup-steps", "3", "--eval-every", "15"])
    assert logged[0]["step"] == 0 and logged[-1]["step"] == 30
    assert logged[-1]["val_loss"] < logged[0]["val_loss"] - 1.0  # it learned the examples it saw
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    for name in ("adapter_config.json", "finetune_args.json"):  # files that may be shipped: no machine paths
        assert str(tmp_path.parent) not in (out / name).read_text()

    model, tokenizer = load_pretrained(tiny_base)
    load_adapter(model, out, "translate")
    prompt, completion = TASKS["translate"].format_example(
        *data.example_from_record("translate", task_splits["translate"]["train"][0]))
    ids = torch.tensor([tokenizer.encode(prompt + completion)])
    with torch.no_grad():
        off = model(ids)
        with active_adapter("translate"):
            on = model(ids)
        base, _ = load_pretrained(tiny_base)
        assert torch.equal(off, base(ids))
    assert (on - off).abs().max() > 1e-2


def test_finetune_continues_a_saved_adapter(task_splits, tiny_base, tmp_path):
    """--init-adapter starts from the saved adapter's weights (step 0 scores as it does) and its rank."""
    records = write_jsonl(tmp_path / "train.jsonl", task_splits["translate"]["train"][:24])
    common = ["--task", "translate", "--data", str(records), "--val", str(records), "--base", str(tiny_base),
              "--batch-size", "8", "--lr", "3e-2", "--warmup-steps", "3", "--eval-every", "10",
              "--precision", "fp32"]  # as on every machine: bf16's rounding at this rate can undo 10 steps
    first = finetune.main([*common, "--out", str(tmp_path / "first"), "--steps", "10", "--rank", "4"])
    more = finetune.main([*common, "--out", str(tmp_path / "more"), "--steps", "10",
                          "--init-adapter", str(tmp_path / "first")])
    assert more[0]["val_loss"] == pytest.approx(first[-1]["val_loss"], rel=1e-4)
    assert more[-1]["val_loss"] < more[0]["val_loss"]
    assert json.loads((tmp_path / "more" / "adapter_config.json").read_text())["r"] == 4
    recorded = json.loads((tmp_path / "more" / "finetune_args.json").read_text())
    assert recorded["rank"] == 4 and str(tmp_path.parent) not in recorded["init_adapter"]


def test_finetune_on_a_transformers_gpt2_checkpoint(task_splits, tmp_path):
    """`--base` a GPT-2 checkpoint in HF layout: the adapter gives the same logits in PEFT + transformers."""
    base = make_hf_checkpoint(tmp_path / "hf", n_positions=64, n_embd=32, n_layer=2, n_head=2)
    records = write_jsonl(tmp_path / "train.jsonl", task_splits["dialogue"]["train"][:8])
    out = tmp_path / "adapter"
    finetune.main(["--task", "dialogue", "--data", str(records), "--out", str(out), "--base", str(base),
                   "--steps", "2", "--batch-size", "4", "--lr", "5e-2", "--warmup-steps", "0"])
    ours, tokenizer = load_pretrained(base)
    load_adapter(ours, out, "dialogue")
    ids = torch.tensor([tokenizer.encode("User: Hello there!\nBot: Hi.")])
    reference = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base), out).eval()
    with torch.no_grad(), active_adapter("dialogue"):
        assert (ours(ids) - reference(ids).logits).abs().max() < 1e-4
        assert not torch.allclose(ours(ids), GPT2LMHeadModel.from_pretrained(base)(ids).logits, atol=1e-4)


def test_eval_writes_every_metric(task_splits, tiny_base, tokenizer, tmp_path):
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_base, checkpoint)
    base_model, _ = load_pretrained(checkpoint)
    for seed, task in enumerate(("dialogue", "translate", "summarize")):
        make_lora_adapter(base_model, checkpoint / "adapters" / task, seed=seed)
    test_data = write_splits(task_splits, tmp_path / "data")
    out = tmp_path / "docs" / "eval.md"
    rows = task_eval.main(["--model", str(checkpoint), "--data", str(test_data), "--out", str(out), "--limit", "1"])
    table = out.read_text()
    for name in ("bits per byte", "chrF", "BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "response loss",
                 "English->French", "German->English", "all directions", "Aesop", "derived"):
        assert name in table, name
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["rows"] == rows
    # the generalisation row on validation too, of the validation sentences, for the shipping gate
    for evaluated in (written["rows"], written["validation_rows"]):
        far = task_eval.find_row(evaluated, *task_eval.GENERALISATION[:3])
        assert far is not None and far["n"] == 4  # --limit 1: one sentence in each direction to or from English
    assert "per_item" in task_eval.find_row(written["validation_rows"], *task_eval.GENERALISATION[:3])
    for r in rows:
        assert math.isfinite(r["base"]) and (r["adapter"] is None) == (r["metric"].startswith("bits per byte"))
    assert str(tmp_path) not in table  # no machine paths in a table meant for docs/
    per_token, per_byte = [r for r in rows if r["task"] == "dialogue" and "loss" in r["metric"]]
    assert per_token["adapter"] != per_token["base"] and "bits per byte" in per_byte["metric"]
    # the same responses scored, counted per byte instead of per token: the two rows' ratios agree
    assert per_byte["adapter"] / per_byte["base"] == pytest.approx(per_token["adapter"] / per_token["base"])
    assert per_byte["base"] != per_token["base"]
    # --limit bounds bits per byte too: the first limit x BPB_CHARS_PER_LIMIT characters
    bpb = next(r for r in rows if r["metric"].startswith("bits per byte"))
    assert bpb["n"] == len(tinystories_validation_text()[:task_eval.BPB_CHARS_PER_LIMIT].encode())
    # summarisation is sampled: its rows carry a standard error over the seeds; chrF and the dialogue
    # loss one over their items (a bootstrap); BLEU, bits per byte and the loop rate none
    assert json.loads(out.with_suffix(".json").read_text())["seeds"] == list(task_eval.SEEDS)
    for r in rows:
        noisy = r["task"] in ("summarize", "dialogue") and "loop" not in r["metric"] or r["metric"] == "chrF"
        assert ("standard_error" in r) == noisy, r
        line = next(line for line in table.splitlines() if f"| {r['metric']} | {r['test_set']} |" in line)
        assert line.count(" ± ") == (2 if noisy else 0), line
        if noisy:
            assert all(r["standard_error"][system] >= 0 for system in ("base", "adapter"))
    # beside each chrF, BLEU and ROUGE, the baselines; each task's loop rate
    for r in rows:
        kinds = {"translate": {"copy the source", "nearest training pair"},
                 "summarize": {"best constant answer", "last sentence"}}.get(r["task"], set())
        assert set(r.get("baselines", {})) == (kinds if r["metric"] in ("chrF", "BLEU") or "ROUGE" in r["metric"]
                                               else set()), r
    assert {r["task"] for r in rows if r["metric"] == task_eval.LOOP_METRIC} == {"translate", "summarize", "dialogue"}


def test_eval_picks_the_adapters_that_start_on_from_the_validation_splits_only(task_splits, tiny_base, tmp_path,
                                                                               capsys):
    """--on-by-default writes the adapters that beat the prompt alone on the validation rows, which
    the checkpoint then starts with; test splits that say otherwise change nothing; with --limit
    (a quick run) it is refused, and nothing is written."""
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_base, checkpoint)
    base_model, _ = load_pretrained(checkpoint)
    for seed, task in enumerate(("dialogue", "translate", "summarize")):
        make_lora_adapter(base_model, checkpoint / "adapters" / task, seed=seed)
    data = write_splits(task_splits, tmp_path / "data", small=True)
    common = ["--model", str(checkpoint), "--data", str(data), "--on-by-default", str(checkpoint / "adapters"),
              "--bpb-chars", "2000"]
    with pytest.raises(SystemExit):
        task_eval.main([*common[:-2], "--out", str(tmp_path / "quick.md"), "--limit", "1"])
    assert "--on-by-default takes the whole splits" in capsys.readouterr().err
    assert not (checkpoint / "adapters" / "on_by_default.json").exists()
    out = tmp_path / "docs" / "eval.md"
    rows = task_eval.main([*common, "--out", str(out)])
    evaluation = json.loads(out.with_suffix(".json").read_text())
    helped = evaluation["adapters_that_help"]
    assert json.loads((checkpoint / "adapters" / "on_by_default.json").read_text()) == {"on": helped}
    assert adapters_on_by_default(load_pretrained(checkpoint)[0]) == helped
    assert helped == task_eval.adapters_that_help(evaluation["validation_rows"])
    # each headline row of the validation splits keeps its items, whose statistics summed give its
    # scores (what the shipping gate pairs two editions on); the test rows keep none
    kept = [r for r in evaluation["validation_rows"] if "per_item" in r]
    assert {(r["task"], r["metric"], r["test_set"]) for r in kept} == task_eval.HEADLINE_ROWS
    for r in kept:
        for system in ("base", "adapter"):
            statistics = np.array(json.loads(r["per_item"]["statistics"][system]))
            assert len(statistics) == r["n"]
            assert task_eval.score_of_sums(r["per_item"]["score"], statistics.sum(0)) == pytest.approx(r[system])
    assert not any("per_item" in r for r in evaluation["rows"])
    per_direction = [r for r in rows if r["task"] == "translate" and re.search(r"\w->\w+$", r["test_set"])]
    assert len(per_direction) == 2 * (4 + 6) and {r["n"] for r in per_direction} == {1}  # Tatoeba, new sentences
    # poisoned test splits (each reference another record's, each response empty of sense): the same choice
    for name in ("translate-test.jsonl", "summarize-test.jsonl", "dialogue-test.jsonl"):
        records = [json.loads(line) for line in (data / name).read_text().splitlines()]
        key = {"translate": "translation", "summarize": "summary", "dialogue": "response"}[name.split("-")[0]]
        write_jsonl(data / name, [{**r, key: "zzz qqq " * 20} for r in records])
    task_eval.main([*common, "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text())["adapters_that_help"] == helped
    assert json.loads(out.with_suffix(".json").read_text())["rows"] != evaluation["rows"]  # the test rows did move


def write_splits(task_splits: dict, directory: Path, small: bool = False) -> Path:
    """The task splits as train.data writes them, training cut to 2,000 records a task (enough for the
    baselines); small: one record a file, and a translation a direction."""
    for task, of_task in task_splits.items():
        for name, records in of_task.items():
            if name == "train":
                records = records[:2000]
            elif small and task == "translate":
                records = list({(r["source"], r["target"]): r for r in reversed(records)}.values())
            elif small:
                records = records[:1]
            write_jsonl(directory / f"{task}-{name}.jsonl", records)
    return directory


def test_a_sampled_score_is_the_mean_of_its_seeds_scores(task_splits, tiny_base, monkeypatch):
    model, tokenizer = load_pretrained(tiny_base)
    records = task_splits["summarize"]["test"][:2]
    # A random model's summaries share no words with a real lesson; seed 0's own summaries as the
    # references give seed 0 full marks and the other seeds less.
    records = [{**r, "summary": summary}
               for r, summary in zip(records, task_eval.generate_all("summarize", model, tokenizer, records, False, 0))]

    def rouge_l(seeds):
        monkeypatch.setattr(task_eval, "SEEDS", seeds)
        rows = task_eval.summarization_rows(model, tokenizer, records, "fables", ["base"],
                                            task_splits["summarize"]["train"])
        return next(r for r in rows if r["metric"] == "ROUGE-L F1")

    each = [rouge_l((seed,))["base"] for seed in (0, 1, 2)]
    assert len(set(each)) > 1  # the seeds sample different summaries, or the mean would hide nothing
    together = rouge_l((0, 1, 2))
    assert together["base"] == pytest.approx(sum(each) / 3)
    mean = sum(each) / 3
    assert together["standard_error"]["base"] == pytest.approx(
        math.sqrt(sum((v - mean) ** 2 for v in each) / 2 / 3))
    assert "standard_error" not in rouge_l((0,))  # one seed has none


def run_eval(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train.eval", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def test_eval_without_task_data_says_what_is_missing_and_how_to_make_it_before_any_work(tmp_path, pretraining_data):
    """Checked before the model is even loaded: a missing model would otherwise be named first."""
    done = run_eval("--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "no-data"))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "task data is missing" in lines[0] and "dialogue-test.jsonl" in lines[0]
    assert f"python -m train.data --out {tmp_path / 'no-data'}" in lines[0]


def test_eval_without_the_data_folder_names_it_and_the_variable_that_moves_it(tmp_path):
    done = run_eval("--data", str(tmp_path), STUDIO_DATA_DIR=str(tmp_path / "nowhere"))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "data folder is missing" in lines[0] and "STUDIO_DATA_DIR" in lines[0], done.stderr


def test_eval_of_a_model_that_cannot_load_is_one_line(task_splits, tmp_path):
    write_splits(task_splits, tmp_path / "data", small=True)
    done = run_eval("--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "data"))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "could not load the model" in lines[0] and "does not exist" in lines[0], done.stderr


def hand_bits_per_byte(model, tokenizer, text) -> float:
    """Sum of -log2 p(token | every token before it), from one forward pass over the whole text."""
    ids = torch.tensor([[tokenizer.eos_id] + tokenizer.encode(text)])
    with torch.no_grad():
        log_probs = F.log_softmax(model(ids[:, :-1]), dim=-1)
    nats = -log_probs.gather(-1, ids[:, 1:, None]).sum().item()
    return nats / math.log(2) / len(text.encode())


def test_bits_per_byte_matches_a_hand_computation(tokenizer):
    model = tiny_model(tokenizer, n_positions=64)
    assert len(tokenizer.encode(TEXT)) < 64  # one window: exactly the full forward pass
    assert bits_per_byte(model, tokenizer, TEXT) == pytest.approx(hand_bits_per_byte(model, tokenizer, TEXT), rel=1e-5)
    non_ascii = "Le café est très bon. Über den Fluß."  # bytes, not characters, are the unit
    assert bits_per_byte(model, tokenizer, non_ascii) == pytest.approx(hand_bits_per_byte(model, tokenizer, non_ascii),
                                                                       rel=1e-5)


def test_bits_per_byte_windows_give_each_token_the_context_they_promise(tokenizer):
    model = tiny_model(tokenizer, n_positions=8)
    text = TEXT * 2
    ids = [tokenizer.eos_id] + tokenizer.encode(text)
    # stride 1: every token is predicted from the n_positions tokens before it (fewer only at the start).
    nats = 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            context = torch.tensor([ids[max(0, t - 8):t]])
            nats -= F.log_softmax(model(context)[0, -1], dim=-1)[ids[t]].item()
    expected = nats / math.log(2) / len(text.encode())
    assert bits_per_byte(model, tokenizer, text, stride=1) == pytest.approx(expected, rel=1e-5)
    # The default stride (half the context) batches windows of unequal length; batching changes nothing.
    assert bits_per_byte(model, tokenizer, text, batch_size=1) == pytest.approx(
        bits_per_byte(model, tokenizer, text, batch_size=7), rel=1e-6)

"""Train the bundled model's SentencePiece tokenizer and report how well it compresses.

    python scripts/train_tokenizer.py --vocab-size 8192 --out assets/tokenizer
    python scripts/train_tokenizer.py --check assets/tokenizer.model

--check only reports on an existing tokenizer: bytes per token on English stories, French and
German (against GPT-2's BPE), and the byte-fallback rate, the share of tokens that are single
bytes because no piece covered the text (accented letters, umlauts).

Training text: the pretraining train split (Gutenberg + TinyStories) plus the
task data's training splits (Tatoeba English/French/German, dialogues, Aesop,
as train.data.pretraining_documents writes them for pretraining), so French
and German words get their own pieces; no validation or test record is read. Each part is cut to a byte budget by
keeping every k-th line, which is deterministic: the same data and flags
always give the same tokenizer.
"""

import argparse
import math
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from train.data import pretraining_documents  # noqa: E402
from train import corpus  # noqa: E402
from model.tokenizer import GPT2BPETokenizer, SentencePieceTokenizer, Tokenizer, train_sentencepiece  # noqa: E402


def every_kth_line(texts, budget_mb: float) -> list[str]:
    """Non-blank lines of `texts`, thinned evenly to about `budget_mb` megabytes."""
    lines = [line for text in texts for line in text.split("\n") if line.strip()]
    total = sum(len(line.encode()) for line in lines)
    return lines[::max(1, math.ceil(total / (budget_mb * 1e6)))]


def task_documents(splits: dict | None = None) -> list[str]:
    """The task data's training splits, as pretraining reads them (splits: train.data's, where
    the caller has them): the held-out units cut for validation and test never reach the tokenizer."""
    return [document for documents in pretraining_documents(splits).values() for document in documents]


def bytes_per_token(tokenizer: Tokenizer, texts: list[str]) -> float:
    return sum(len(text.encode()) for text in texts) / sum(len(tokenizer.encode(text)) for text in texts)


def byte_fallback_rate(tokenizer: Tokenizer, texts: list[str]) -> float | None:
    """Share of tokens that are byte pieces (SentencePiece's <0xAB>); None for a byte-level BPE."""
    processor = getattr(tokenizer, "processor", None)
    if processor is None:
        return None
    ids = [i for text in texts for i in tokenizer.encode(text)]
    return sum(processor.is_byte(i) for i in ids) / len(ids)


def report(tokenizer: Tokenizer) -> None:
    gpt2_dir = corpus.DATA_DIR / "gpt2-bpe"
    gpt2 = GPT2BPETokenizer.from_files(gpt2_dir / "encoder.json", gpt2_dir / "vocab.bpe")
    samples = {
        "TinyStories validation": [corpus.tinystories_validation_text()],
        "French (Tatoeba)": [french for _, french in corpus.translation_pairs("fra")],
        "German (Tatoeba)": [german for _, german in corpus.translation_pairs("deu")],
    }
    print("| text | bytes per token, this | GPT-2 | byte fallback, this |\n|---|---:|---:|---:|")
    for name, texts in samples.items():
        fallback = byte_fallback_rate(tokenizer, texts)
        print(f"| {name} | {bytes_per_token(tokenizer, texts):.2f} | {bytes_per_token(gpt2, texts):.2f} | "
              + (f"{fallback:.2%} |" if fallback is not None else "— |"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=8192,
                        help="pieces in the vocabulary, bytes and specials included (default: 8192)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "assets" / "tokenizer",
                        help="output prefix; writes <out>.model (default: assets/tokenizer)")
    parser.add_argument("--pretrain-mb", type=float, default=12,
                        help="megabytes of pretraining text to train on (default: 12)")
    parser.add_argument("--task-mb", type=float, default=6,
                        help="megabytes of task text (translation, dialogue, fables) to train on (default: 6)")
    parser.add_argument("--check", type=Path, default=None, metavar="MODEL",
                        help="only report on this existing SentencePiece model, train nothing")
    args = parser.parse_args()
    if args.check:
        report(SentencePieceTokenizer.from_file(args.check))
        return

    start = time.perf_counter()
    lines = (every_kth_line(corpus.pretrain_documents("train"), args.pretrain_mb)
             + every_kth_line(task_documents(), args.task_mb))
    megabytes = sum(len(line.encode()) for line in lines) / 1e6
    print(f"training on {len(lines):,} lines, {megabytes:.1f} MB")
    tokenizer = train_sentencepiece(lines, args.out, args.vocab_size)
    model_path = Path(f"{args.out}.model")
    print(f"wrote {model_path} ({model_path.stat().st_size / 1e3:.0f} kB, vocab_size {tokenizer.vocab_size}, "
          f"eos_id {tokenizer.eos_id}) in {time.perf_counter() - start:.0f} s")

    validation = corpus.tinystories_validation_text()
    if tokenizer.decode(tokenizer.encode(validation)) != validation:
        sys.exit("decode(encode(text)) != text on the TinyStories validation split")
    report(tokenizer)

if __name__ == "__main__":
    main()

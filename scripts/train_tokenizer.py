"""Train the bundled model's SentencePiece tokenizer and report how well it compresses.

    python scripts/train_tokenizer.py --vocab-size 8192 --out assets/tokenizer

Training text: the pretraining train split (Gutenberg + TinyStories) plus the
task data (Tatoeba English/French/German, dialogue turns, Aesop), so French
and German words get their own pieces. Each part is cut to a byte budget by
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

from train import corpus  # noqa: E402
from model.tokenizer import GPT2BPETokenizer, Tokenizer, train_sentencepiece  # noqa: E402


def every_kth_line(texts, budget_mb: float) -> list[str]:
    """Non-blank lines of `texts`, thinned evenly to about `budget_mb` megabytes."""
    lines = [line for text in texts for line in text.split("\n") if line.strip()]
    total = sum(len(line.encode()) for line in lines)
    return lines[::max(1, math.ceil(total / (budget_mb * 1e6)))]


def tokens_per_byte(tokenizer: Tokenizer, texts: list[str]) -> float:
    return sum(len(tokenizer.encode(text)) for text in texts) / sum(len(text.encode()) for text in texts)


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
    args = parser.parse_args()

    start = time.perf_counter()
    lines = (every_kth_line(corpus.pretrain_documents("train"), args.pretrain_mb)
             + every_kth_line(corpus.task_texts(), args.task_mb))
    megabytes = sum(len(line.encode()) for line in lines) / 1e6
    print(f"training on {len(lines):,} lines, {megabytes:.1f} MB")
    tokenizer = train_sentencepiece(lines, args.out, args.vocab_size)
    model_path = Path(f"{args.out}.model")
    print(f"wrote {model_path} ({model_path.stat().st_size / 1e3:.0f} kB, vocab_size {tokenizer.vocab_size}, "
          f"eos_id {tokenizer.eos_id}) in {time.perf_counter() - start:.0f} s")

    validation = corpus.tinystories_validation_text()
    if tokenizer.decode(tokenizer.encode(validation)) != validation:
        sys.exit("decode(encode(text)) != text on the TinyStories validation split")
    gpt2_dir = corpus.DATA_DIR / "gpt2-bpe"
    gpt2 = GPT2BPETokenizer.from_files(gpt2_dir / "encoder.json", gpt2_dir / "vocab.bpe")
    samples = {
        "TinyStories validation": [validation],
        "French (Tatoeba)": [french for _, french in corpus.translation_pairs("fra")],
        "German (Tatoeba)": [german for _, german in corpus.translation_pairs("deu")],
    }
    print(f"{'tokens per byte':<24}{'this':>8}{'GPT-2':>8}")
    for name, texts in samples.items():
        print(f"{name:<24}{tokens_per_byte(tokenizer, texts):>8.3f}{tokens_per_byte(gpt2, texts):>8.3f}")


if __name__ == "__main__":
    main()

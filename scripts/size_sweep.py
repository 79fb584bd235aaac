"""Pick the bundled model's size from measured held-out loss at equal compute.

    python scripts/size_sweep.py --minutes 4 --out runs/sweep

Trains each candidate shape from scratch for the same wall-clock time on this machine (the
compute a session actually has), with the pretraining recipe of train.pretrain, and prints a
table of each one's held-out loss at the end. Vocabulary and tokenizer stay those of assets/
(scripts/train_tokenizer.py reports how they compress English, French and German).
"""
import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from train import pretrain  # noqa: E402

CANDIDATES = {  # name: (layers, width, heads)
    "4x256": (4, 256, 8),
    "6x256": (6, 256, 8),
    "8x384": (8, 384, 8),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=4, help="training time per candidate")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "sweep")
    parser.add_argument("--only", nargs="*", default=list(CANDIDATES), help="candidates to run")
    parser.add_argument("extra", nargs="*", help="more train.pretrain flags, after --")
    args = parser.parse_args()
    rows = []
    for name in args.only:
        layers, width, heads = CANDIDATES[name]
        out = args.out / name
        pretrain.main(["--out", str(out), "--minutes", str(args.minutes), "--n-layer", str(layers),
                       "--n-embd", str(width), "--n-head", str(heads), "--block-size", "512", "--batch-size", "8",
                       "--warmup-steps", "50", "--eval-every", "100000", "--save-every", "100000", *args.extra])
        last = json.loads((out / "log.jsonl").read_text().splitlines()[-1])
        settings = json.loads((out / "train_args.json").read_text())
        rows.append((name, last, settings["max_steps"] * 8 * 512))
    print(f"\n| shape | tokens seen in {args.minutes:g} min | held-out loss, TinyStories | Gutenberg | mean |")
    print("|---|---:|---:|---:|---:|")
    for name, last, tokens in rows:
        print(f"| {name} | {tokens:,} | {last['val_tinystories']:.3f} | {last['val_gutenberg']:.3f} | {last['val_loss']:.3f} |")


if __name__ == "__main__":
    main()

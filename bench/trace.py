"""Activation patching's speed (engine/patching.py): the bundled model and GPT-2's 124M shape
(random weights, no download), side by side.

    python -m bench.trace [--tokens 24] [--reps 3]

For each model, a clean prompt of --tokens random tokens and a corrupted one with one token
changed (position 5): the seconds to record both runs, to trace the residual grid, all three
grids (residual stream, attention, MLP: what /trace answers), and the residual grid with noise on
two tokens (5 samples) instead. Each figure is the median of --reps; the models run on PyTorch's
path, as a trace's batches of patched copies do in the app (the decode kernels take a few rows
only). Targets: the 124M shape's residual grid of a 24-token prompt under 10 s, the bundled
model's under 1 s.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from engine.patching import NOISE_SAMPLES, Patching
from model import GPT2, GPT2Config, load_pretrained

TARGETS_S = {"bundled": 1.0, "124M shape": 10.0}  # the residual grid


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def seconds(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def timings(model: GPT2, tokens: int, reps: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.config.vocab_size, (tokens,), generator=generator).tolist()
    corrupted = list(clean)
    corrupted[5] = (corrupted[5] + 1) % model.config.vocab_size
    rounds: dict[str, list[float]] = {}
    for _ in range(reps):
        recorded = []
        rounds.setdefault("record both runs", []).append(seconds(lambda: recorded.append(Patching(model, clean, corrupted))))
        rounds.setdefault("residual grid", []).append(seconds(lambda: recorded[0].grid("residual")))
        rounds.setdefault("all three grids", []).append(seconds(lambda: recorded[0].grids()))
        rounds.setdefault(f"residual grid, noise on 2 tokens ({NOISE_SAMPLES} samples, with recording)", []).append(
            seconds(lambda: Patching(model, clean, noised=[4, 5]).grid("residual")))
    return {name: statistics.median(values) for name, values in rounds.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    models = {"bundled": load_pretrained(None, device="cpu")[0].eval(), "124M shape": GPT2(GPT2Config()).eval()}
    results = {name: timings(model, args.tokens, args.reps) for name, model in models.items()}
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{args.tokens}-token prompts, median of {args.reps}")
    print()
    print(f"| seconds | {' | '.join(results)} |")
    print(f"|---|{'---:|' * len(results)}")
    for row in next(iter(results.values())):
        print(f"| {row} | {' | '.join(f'{r[row]:.2f}' for r in results.values())} |")
    met = ", ".join(f"{name} {r['residual grid']:.2f} s < {TARGETS_S[name]:g} s: "
                    f"{'yes' if r['residual grid'] < TARGETS_S[name] else 'no'}" for name, r in results.items())
    print(f"\nTarget, the residual grid: {met}")


if __name__ == "__main__":
    main()

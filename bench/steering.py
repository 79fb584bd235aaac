"""Steering's cost: a batch of 8 where every row steers differently, against the same batch without
steering, side by side in one process.

    python -m bench.steering [--new-tokens N] [--reps N]

The bundled model as the app serves it (engine.prepare_for_serving: the decode kernels, built
first, and the steering hooks). Eight requests go into one Scheduler together, greedy, from short
prompts; in the steered runs row i adds its own vector (from its own pair of texts) at layer
i mod (n_layer + 1), so every layer's hook has rows to add to and others to leave alone: the most
work steering can cost. The runs alternate and each number is the median of --reps runs; the
ratio is also taken round by round (both sides seconds apart), as bench.decode does. Target
(issue 58): steering adds at most 5% to the time per token. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench import cpu_name
from engine import kernels, prepare_for_serving
from engine.generate import SamplingParams
from engine.scheduler import Scheduler, in_thread_of_its_own
from engine.steering import Steering, steering_vector
from model import load_pretrained

BATCH = 8
PROMPTS = ["Once upon a time", "The cat sat", "In the beginning", "Hello", "A long time ago", "Yes",
           "Question: why?", "The little bird"]
PAIRS = [("Love", "Hate"), ("happy", "sad"), ("big", "small"), ("day", "night"), ("good", "bad"),
         ("hot", "cold"), ("friend", "enemy"), ("yes", "no")]


def crowd_seconds(scheduler: Scheduler, prompts: list[list[int]], steerings: list, new_tokens: int) -> float:
    """Seconds for BATCH requests queued together to decode new_tokens each."""
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    streams = [scheduler.decode(prompt, params, 0, steering=steering) for prompt, steering in zip(prompts, steerings)]
    start = time.perf_counter()
    counts = [sum(1 for _ in stream) for stream in streams]
    elapsed = time.perf_counter() - start
    assert counts == [new_tokens] * BATCH, counts
    return elapsed


def measure(new_tokens: int, reps: int) -> dict:
    kernels.wait_until_built()
    model, tokenizer = in_thread_of_its_own(lambda: load_pretrained())
    model = prepare_for_serving(model)
    n_layer = model.config.n_layer
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    steerings = []
    for row, (positive, negative) in enumerate(PAIRS):
        layer = row % (n_layer + 1)
        vector, _ = steering_vector(model, tokenizer, positive, negative, layer)
        steerings.append(Steering(layer, vector, 1.0 + row / 4))
    scheduler = Scheduler(model, max_batch=BATCH)
    sides = {"none": [None] * BATCH, "steered": steerings}
    crowd_seconds(scheduler, prompts, sides["steered"], 8)  # warm up both
    crowd_seconds(scheduler, prompts, sides["none"], 8)
    samples = {side: [] for side in sides}
    for _ in range(reps):
        for side, rows in sides.items():
            samples[side].append(crowd_seconds(scheduler, prompts, rows, new_tokens))
    scheduler.close()
    tokens = BATCH * new_tokens
    per_round = statistics.median(s / n for s, n in zip(samples["steered"], samples["none"]))
    return {side: tokens / statistics.median(seconds) for side, seconds in samples.items()} | {
        "ratio": per_round, "decode_path": kernels.decode_path(), "n_layer": n_layer}


def table(n: dict, new_tokens: int, reps: int) -> str:
    return "\n".join([
        f"CPU: {cpu_name()} · torch {__import__('torch').__version__} · {n['decode_path']} · bundled model "
        f"({n['n_layer']} blocks) · batch {BATCH}, {new_tokens} new tokens each, greedy · median of {reps} runs",
        "",
        "| batch of 8 | tokens/s |",
        "|---|---|",
        f"| no steering | {n['none']:.0f} |",
        f"| every row steered differently (layers 0..{n['n_layer']}, 8 vectors) | {n['steered']:.0f} |",
        f"| time per token, steered / none (median of rounds) | {n['ratio']:.3f}x |",
    ])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    print(table(measure(args.new_tokens, args.reps), args.new_tokens, args.reps))


if __name__ == "__main__":
    main()

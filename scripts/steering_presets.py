"""Measure candidate steering presets on the bundled model: each candidate pair set at a few layers
and strengths, greedy and sampled (fixed seeds), on a few story openings; prints how often the text
says a happy or a sad word, and how much of it repeats. The presets in ui/steer.py are the best of
these (docs/app.md has the table). Run: python scripts/steering_presets.py"""
from __future__ import annotations

import re

import torch

from engine.generate import SamplingParams, decode_tokens
from engine.steering import Steering, steering_vector
from model import load_pretrained
from model.checkpoint import resolve_checkpoint

PROMPTS = ["Once upon a time, there was a little girl named Lily. She felt",
           "Tom went to the park with his dog. He was",
           "The old man looked at the empty house and felt"]
CANDIDATES = {
    "love-hate (one word pair)": (["Love"], ["Hate"]),
    "happy-sad (three sentences)": (["She was very happy and loved to play.", "The day was fun and bright.",
                                     "He smiled and laughed with his friends."],
                                    ["She was very sad and cried a lot.", "The day was bad and dark.",
                                     "He frowned and was angry with his friends."]),
    "sad-happy (three sentences)": (["She was very sad and cried a lot.", "The day was bad and dark.",
                                     "He frowned and was angry with his friends."],
                                    ["She was very happy and loved to play.", "The day was fun and bright.",
                                     "He smiled and laughed with his friends."]),
}
HAPPY = {"happy", "smiled", "smile", "laughed", "fun", "loved", "love", "glad", "excited", "joy", "best", "great"}
SAD = {"sad", "cried", "cry", "angry", "scared", "upset", "lonely", "mad", "hurt", "bad", "frowned", "afraid"}
SEEDS = (0, 1, 2)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def run(model, tokenizer, steering, greedy: bool) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        for seed in (SEEDS[:1] if greedy else SEEDS):
            params = SamplingParams(temperature=0.0 if greedy else 0.8, top_k=0 if greedy else 40,
                                    max_new_tokens=40, seed=seed)
            out = [int(t[0]) for _, t in zip(range(40), decode_tokens(model, [ids], params, [seed],
                                                                      steering=steering))]
            texts.append(tokenizer.decode(out))
    return texts


def score(texts: list[str]) -> tuple[int, int, float]:
    all_words = [w for t in texts for w in words(t)]
    happy, sad = sum(w in HAPPY for w in all_words), sum(w in SAD for w in all_words)
    distinct = sum(len(set(words(t))) / max(1, len(words(t))) for t in texts) / len(texts)
    return happy, sad, distinct


@torch.inference_mode()
def main() -> None:
    model, tokenizer = load_pretrained(resolve_checkpoint(None))
    model.eval()
    n = model.config.n_layer
    print(f"bundled: {n} layers; {len(PROMPTS)} prompts; sampled: temperature 0.8, top_k 40, seeds {SEEDS}")
    print("| pairs | layer | strength | norm / typical | greedy happy/sad | sampled happy/sad | distinct words |")
    print("|---|---|---|---|---|---|---|")
    base_g, base_s = score(run(model, tokenizer, None, True)), score(run(model, tokenizer, None, False))
    print(f"| none | - | 0 | - | {base_g[0]}/{base_g[1]} | {base_s[0]}/{base_s[1]} | {base_s[2]:.2f} |")
    for name, (positive, negative) in CANDIDATES.items():
        for layer in sorted({1, 2, n // 2, n - 1}):
            vector, typical = steering_vector(model, tokenizer, positive, negative, layer)
            for strength in (1.0, 2.0, 4.0):
                steering = Steering(layer, vector, strength)
                g, s = score(run(model, tokenizer, steering, True)), score(run(model, tokenizer, steering, False))
                print(f"| {name} | {layer} | {strength:g} | {float(vector.norm()):.1f} / {typical:.1f} "
                      f"| {g[0]}/{g[1]} | {s[0]}/{s[1]} | {s[2]:.2f} |", flush=True)
    layer = 2
    for name in ("happy-sad (three sentences)", "sad-happy (three sentences)"):
        vector, _ = steering_vector(model, tokenizer, *CANDIDATES[name], layer)
        print(f"\n{name}, layer {layer}, strength 2, greedy:")
        for text in run(model, tokenizer, Steering(layer, vector, 2.0), True):
            print("  ", repr(text[:120]))
    print("\nunsteered, greedy:")
    for text in run(model, tokenizer, None, True):
        print("  ", repr(text[:120]))


if __name__ == "__main__":
    main()

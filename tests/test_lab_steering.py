"""The lab's steering measurement (python -m train.lab steering) on a tiny configuration: it runs,
and gives a finite KL per variant and layer."""
from __future__ import annotations

import json
import math

from model.config import GPT2Config
from train.lab import SteeringLab, VARIANTS, build, bundled_tokenizer, main, steering_kl, steering_kl_by_layer

TINY = SteeringLab(seeds=2, n_layer=2, n_embd=16, n_head=2, block_size=32, steps=0)


def test_kl_by_layer_is_finite_non_negative_and_zero_without_a_strength():
    tokenizer = bundled_tokenizer()
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=32, n_embd=16, n_head=2, n_layer=2,
                        **VARIANTS["post"])
    model = build(config, "gpt2", seed=0).eval()
    measured = steering_kl_by_layer(model, tokenizer, relative_strength=1.0)
    assert [len(measured[k]) for k in ("kl", "vector_norm", "residual_norm")] == [3, 3, 3]
    assert measured["prompt_kl"] > 0
    assert all(math.isfinite(kl) and kl >= 0 for kl in measured["kl"])
    assert sum(measured["kl"]) > 0
    assert steering_kl_by_layer(model, tokenizer, relative_strength=0.0)["kl"] == [0.0, 0.0, 0.0]


def test_the_strength_is_relative_to_the_residual_norm_at_the_layer():
    """What is added has norm c * the typical residual norm: c = 2 moves the output more than c = 1."""
    tokenizer = bundled_tokenizer()
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=32, n_embd=16, n_head=2, n_layer=2)
    model = build(config, "gpt2", seed=0).eval()
    one, two = (steering_kl_by_layer(model, tokenizer, c)["kl"] for c in (1.0, 2.0))
    assert all(b > a for a, b in zip(one, two))


def test_the_measurement_has_a_kl_per_seed_and_layer_for_each_variant():
    results = steering_kl(TINY)
    assert results["layers"] == [0, 1, 2]
    for variant in TINY.variants:
        runs = results[variant]["runs"]
        assert [run["seed"] for run in runs] == [0, 1]
        assert all(len(run["kl"]) == 3 and all(math.isfinite(kl) for kl in run["kl"]) for run in runs)
        assert len(results[variant]["kl_mean"]) == len(results[variant]["kl_std"]) == 3
        assert all(math.isfinite(v) for v in results[variant]["kl_mean"] + results[variant]["kl_std"])


def test_steering_command_writes_json_figure_and_section(tmp_path, capsys):
    markdown = tmp_path / "pre-ln.md"
    markdown.write_text("# prose\n")
    main(["steering", "--seeds", "1", "--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "32",
          "--steps", "0", "--json", str(tmp_path / "kl.json"), "--plot", str(tmp_path / "kl.png"),
          "--markdown", str(markdown)])
    results = json.loads((tmp_path / "kl.json").read_text())
    assert len(results["pre"]["kl_mean"]) == len(results["post"]["kl_mean"]) == 3
    assert (tmp_path / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = markdown.read_text()
    assert text.startswith("# prose\n") and "<!-- train.lab steering: begin -->" in text
    assert "KL(steered" in capsys.readouterr().out

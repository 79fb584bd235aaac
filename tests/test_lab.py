"""The lab commands on tiny configurations, and the gradient norm against a backpropagation done
by hand."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from model.config import GPT2Config
from train.lab import VARIANTS, build, gradnorm_figure, main, mlp_out_grad_norms, residual_sq_norms

from .conftest import REPO

pytestmark = pytest.mark.slow  # training runs (the Pre-LN experiments)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_MODEL = ["--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4"]


def layer_norm_backward(ln: torch.nn.LayerNorm, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d loss / d x of y = gain * (x - mean) / sqrt(var + eps) + bias, written out."""
    sigma = (x.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    x_hat = (x - x.mean(-1, keepdim=True)) / sigma
    g = dy * ln.weight
    return (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) / sigma


@pytest.mark.parametrize("variant", ["pre", "post", "pre_no_final_norm"])
def test_last_layer_gradient_norm_equals_manual_backprop(variant):
    """The last block's MLP output feeds the loss through ln_f (Pre-LN), ln_2 (Post-LN) or
    nothing but the head, so its weight gradient can be written out from the softmax back."""
    config = GPT2Config(vocab_size=50, n_positions=8, n_embd=16, n_head=2, n_layer=2, **VARIANTS[variant])
    model = build(config, "xavier", seed=0).double()
    torch.manual_seed(1)
    with torch.no_grad():  # uneven LayerNorm gains, so a backward that ignores them would show
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
    x, y = torch.randint(0, 50, (3, 8)), torch.randint(0, 50, (3, 8))
    last = model.transformer.h[-1]
    norm_after_mlp = last.ln_2 if variant == "post" else model.transformer.ln_f  # Identity without ln_f
    seen = {}
    hooks = [last.mlp.c_proj.register_forward_pre_hook(lambda m, args: seen.update(activations=args[0])),
             norm_after_mlp.register_forward_pre_hook(lambda m, args: seen.update(normalised=args[0]))]
    with torch.no_grad():
        logits = model(x)
    for h in hooks:
        h.remove()

    with torch.no_grad():
        d_logits = (logits.softmax(-1) - F.one_hot(y, 50).double()) / y.numel()  # mean cross-entropy
        d_head_input = d_logits @ model.lm_head.weight
        if isinstance(norm_after_mlp, torch.nn.LayerNorm):
            d_mlp_out = layer_norm_backward(norm_after_mlp, seen["normalised"], d_head_input)
        else:
            d_mlp_out = d_head_input
        d_weight = d_mlp_out.flatten(0, 1).T @ seen["activations"].flatten(0, 1)  # Linear: out = a @ W.T + b

    norms = mlp_out_grad_norms(model, x, y)
    assert len(norms) == 2
    # lm_loss takes the cross-entropy in float32, hence agreement to float32 precision only.
    assert norms[-1] == pytest.approx(float(d_weight.norm()), rel=1e-6)
    assert norms[0] != pytest.approx(norms[-1], rel=1e-3)


def test_residual_squared_norm_starts_at_the_embeddings():
    model = build(GPT2Config(vocab_size=50, n_positions=8, n_embd=16, n_head=2, n_layer=3), "xavier", seed=0)
    x = torch.randint(0, 50, (2, 8))
    norms = residual_sq_norms(model, x)
    with torch.no_grad():
        embedded = model.transformer.wte(x) + model.transformer.wpe(torch.arange(8))
    assert len(norms) == 4
    assert norms[0] == pytest.approx(float(embedded.pow(2).sum(-1).mean()), rel=1e-6)
    assert norms[-1] > norms[0]  # Pre-LN only ever adds to the stream


def test_gradnorm_command_writes_the_measurements(tmp_path, pretraining_data):
    out = tmp_path / "gradnorm.json"
    doc = tmp_path / "pre-ln.md"
    doc.write_text("# Notes\n\nProse written by a person.\n")
    command = ["gradnorm", "--seeds", "2", *TINY_MODEL, "--depths", "2", "3", "--per-layer-depth", "2",
               "--json", str(out), "--plot", str(tmp_path / "img" / "gradnorm.png"), "--markdown", str(doc)]
    main(command)
    results = json.loads(out.read_text())
    assert set(results) == {"settings", "xavier", "gpt2"}
    for init in ("xavier", "gpt2"):
        r = results[init]
        assert set(r["per_layer"]) == {"pre", "post", "pre_no_final_norm"}
        assert set(r["last_layer_by_depth"]) == {"depths", "pre", "post", "pre_no_final_norm"}
        assert r["last_layer_by_depth"]["depths"] == [2, 3]
        for variant in VARIANTS:
            assert len(r["per_layer"][variant]) == 2 and len(r["last_layer_by_depth"][variant]) == 2
            assert len(r["residual_sq_norm"][variant]) == 3 + 1
            assert r["top_residual_sq_norm_by_depth"][variant][-1] == pytest.approx(r["residual_sq_norm"][variant][-1])
            assert all(v > 0 for v in r["per_layer"][variant] + r["last_layer_by_depth"][variant])
            assert all(s > 0 for s in r["per_layer_std"][variant])  # seeds differ
    # The 2-layer model of the per-layer series is the 2-layer model of the by-depth series.
    assert results["gpt2"]["per_layer"]["post"][-1] == pytest.approx(results["gpt2"]["last_layer_by_depth"]["post"][0])
    assert (tmp_path / "img" / "gradnorm.png").read_bytes().startswith(PNG_MAGIC)

    main(command)  # again: the same numbers, and the same one section in the notes
    assert json.loads(out.read_text()) == results
    text = doc.read_text()
    assert text.startswith("# Notes\n\nProse written by a person.\n")
    assert text.count("<!-- train.lab gradnorm: begin -->") == 1
    assert "| pre_no_final_norm |" in text and "L=3" in text


def test_train_command_runs_the_grid_and_resumes(tmp_path, capsys, pretraining_data):
    out = tmp_path / "train.json"
    doc = tmp_path / "pre-ln.md"
    command = ["train", "--variants", "pre", "post", "--warmups", "0", "4", "--lrs", "3e-3", "50", "--depths", "1",
               "--seeds", "1", "--steps", "8", *TINY_MODEL, "--eval-every", "4", "--val-windows", "2",
               "--train-chars", "40000", "--device", "cpu", "--json", str(out), "--plot",
               str(tmp_path / "train.png"), "--markdown", str(doc)]
    main(command)
    results = json.loads(out.read_text())
    runs = results["runs"]
    assert len(runs) == 2 * 2 * 2
    for r in runs:
        assert [step for step, _ in r["val_loss"]] == [0, 4, 8] or r["final_val_loss"] is None
        final, start = r["final_val_loss"], r["val_loss"][0][1]
        assert r["diverged"] == (final is None or final > start)
    sane = [r for r in runs if r["lr"] == 3e-3]
    assert all(len(r["train_loss"]) == 8 and not r["diverged"] for r in sane)  # 8 steps at 3e-3 do lower the loss
    assert all(r["diverged"] for r in runs if r["lr"] == 50 and r["warmup"] == 0)  # Adam at lr 50 does not
    assert (tmp_path / "train.png").read_bytes().startswith(PNG_MAGIC)
    table = doc.read_text()
    assert table.count("\n| pre |") == 4 and table.count("\n| post |") == 4
    assert "| post | none | 50 | 1 |" in table

    capsys.readouterr()
    main(command)  # every run is already in the JSON: nothing is trained again
    assert "[1/" not in capsys.readouterr().out
    assert json.loads(out.read_text()) == results
    with pytest.raises(SystemExit, match="different grid"):
        main([*command, "--steps", "9"])


def test_train_parts_run_apart_join_into_the_whole_grid(tmp_path, capsys, pretraining_data):
    grid = ["train", "--variants", "pre", "post", "--warmups", "0", "--depths", "1", "--seeds", "1", "--steps", "4",
            *TINY_MODEL, "--eval-every", "4", "--val-windows", "2", "--train-chars", "40000", "--device", "cpu"]
    parts = []
    for lr in ("3e-3", "1e-2"):
        parts.append(tmp_path / f"part-{lr}.json")
        main([*grid, "--lrs", lr, "--json", str(parts[-1])])
    capsys.readouterr()
    whole = tmp_path / "whole.json"
    main([*grid, "--lrs", "1e-2", "3e-3", "--json", str(whole), "--parts", *map(str, parts)])
    assert "[1/" not in capsys.readouterr().out  # every run came from the parts: nothing trained again
    runs = json.loads(whole.read_text())["runs"]
    part_runs = [r for p in parts for r in json.loads(p.read_text())["runs"]]
    assert sorted(map(json.dumps, runs)) == sorted(map(json.dumps, part_runs))
    assert [(r["variant"], r["lr"]) for r in runs] == [("pre", 1e-2), ("pre", 3e-3), ("post", 1e-2), ("post", 3e-3)]
    with pytest.raises(SystemExit, match="other settings"):
        main([*grid, "--steps", "5", "--lrs", "3e-3", "--json", str(tmp_path / "x.json"), "--parts", str(parts[0])])


def test_no_legend_of_the_gradnorm_figure_covers_a_data_point():
    """The figure docs/pre-ln.md shows (from docs/gradnorm.json): matplotlib's "best" legend sat
    on two points of "xavier: last layer by depth"."""
    fig = gradnorm_figure(json.loads((REPO / "docs" / "gradnorm.json").read_text()))
    fig.canvas.draw()
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent()
        for line in ax.get_lines():
            for x, y in ax.transData.transform(line.get_xydata()):
                assert not box.contains(x, y), f"{ax.get_title()}: the legend covers {line.get_label()}"

"""Experiments behind the architecture tab: does Pre-LN really let gradients flow better?

    python -m train.lab gradnorm [--json PATH] [--plot PNG] [--markdown MD]
    python -m train.lab train [--json PATH] [--plot PNG] [--markdown MD] [grid options]
    python -m train.lab steering [--json PATH] [--plot PNG] [--markdown MD] [options]

gradnorm reproduces the measurement of Xiong et al. (2020), "On Layer Normalization in the
Transformer Architecture", Figure 3, on a decoder-only GPT-2 and real text: at initialisation, the
Frobenius norm of the gradient of each layer's MLP output weight (mlp.c_proj) in a 6-layer model,
and of the last layer's at depths 6 to 14, for Pre-LN, Post-LN and Pre-LN without the final
LayerNorm; and their Lemma 2, the squared norm of the residual stream after each layer of the
deepest model. Under two initialisations:
- xavier: Xiong et al.'s setting: Xavier-uniform projections, zero biases, and token and
  position embeddings of unit-order norm (N(0, 1/d), so each row has norm about 1);
- gpt2: GPT-2's own: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer).

train runs a grid of short trainings on the pretraining prose, gradient clipping off: variant x
warmup x learning rate x depth x seed. A run diverged when its loss went non-finite or its final
validation loss is above its validation loss at initialisation. A run already in --json is not
repeated, so an interrupted grid continues where it stopped; --parts takes finished runs from
other files, so parts of a grid can run in parallel (say one per --lrs value) and be joined.

steering asks where an added vector reaches the output: Pre-LN and Post-LN models, briefly trained
on the pretraining prose (--steps 0: at initialisation), get one steering vector (happy minus sad
sentences, engine/steering.py) at each layer L, scaled to the same relative strength (strength *
|v| = c * the typical residual norm at L), added after block L; the measure is the KL divergence
KL(steered || unsteered) of the next-token distribution after a few prompts, per layer and seed.

--markdown replaces this command's section of the file (between its marker comments) with the
tables, and leaves the rest of the file, the prose, as it is.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from engine.residual import residual_stream
from engine.steering import Steering, steered, steering_vector
from model.checkpoint import BUNDLED_DIR, pick_device
from model.config import GPT2Config
from model.gpt2 import GPT2
from model.tokenizer import Tokenizer, load_tokenizer

from .corpus import tinystories_validation_text
from .pretrain import (TrainSettings, lm_loss, mixed_batches, pretraining_streams, random_windows,
                    train, validation_loss)

# Post-LN is the original Transformer's block, whose last LayerNorm already normalises the output:
# no ln_f on top of it.
VARIANTS = {"pre": dict(norm_position="pre"), "post": dict(norm_position="post", final_norm=False),
            "pre_no_final_norm": dict(norm_position="pre", final_norm=False)}
INITS = ("xavier", "gpt2")
DEPTHS = (6, 8, 10, 12, 14)


def init_xavier(model: GPT2) -> None:
    """Xiong et al.'s initialisation (GPT2's own is what the constructor already did)."""
    d = model.config.n_embd
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not model.lm_head:  # lm_head is wte, set below
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    nn.init.normal_(model.transformer.wte.weight, std=d ** -0.5)
    nn.init.normal_(model.transformer.wpe.weight, std=d ** -0.5)


def build(config: GPT2Config, init: str, seed: int) -> GPT2:
    torch.manual_seed(seed)
    model = GPT2(config)
    if init == "xavier":
        init_xavier(model)
    return model


def bundled_tokenizer() -> Tokenizer:
    return load_tokenizer(BUNDLED_DIR)


# --- gradnorm ----------------------------------------------------------------------------------

def mlp_out_grad_norms(model: GPT2, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """||d loss / d W|| (Frobenius) for every layer's mlp.c_proj weight, layer 1 first."""
    weights = [block.mlp.c_proj.weight for block in model.transformer.h]
    grads = torch.autograd.grad(lm_loss(model, x, y), weights)
    return [float(g.norm()) for g in grads]


@torch.no_grad()
def residual_sq_norms(model: GPT2, x: torch.Tensor) -> list[float]:
    """Mean over tokens of ||h||^2, the residual stream after the embeddings and after each block."""
    stream, _ = residual_stream(model, x)
    return [float(h.pow(2).sum(-1).mean()) for h in stream]


def text_batches(n: int, batch_size: int, block_size: int, seed: int = 0) -> tuple[list, int]:
    """n (inputs, labels) batches of real text (held-out TinyStories) in the bundled tokenizer's ids, and its vocab size."""
    tokenizer = bundled_tokenizer()
    data = torch.tensor(tokenizer.encode(tinystories_validation_text()[:400_000]))
    g = torch.Generator().manual_seed(seed)
    return [random_windows(data, batch_size, block_size, g, "cpu") for _ in range(n)], tokenizer.vocab_size


def mean_and_std(values) -> tuple[float, float]:
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std(rows: list[list[float]]) -> tuple[list[float], list[float]]:
    """Mean and standard deviation of each column."""
    columns = [mean_and_std(column) for column in zip(*rows)]
    return [mean for mean, _ in columns], [std for _, std in columns]


def gradnorm(seeds: int = 5, n_embd: int = 256, n_head: int = 8, block_size: int = 128, batch_size: int = 8,
             depths=DEPTHS, per_layer_depth: int = 6) -> dict:
    """The measurements, as the JSON `python -m train.lab gradnorm --json` writes. Seed s
    initialises the models and picks the text batch, so every variant sees the same batches."""
    batches, vocab_size = text_batches(seeds, batch_size, block_size)
    base = GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_embd=n_embd, n_head=n_head,
                      n_layer=per_layer_depth)
    results = {"settings": dict(seeds=seeds, n_embd=n_embd, n_head=n_head, block_size=block_size,
                                batch_size=batch_size, per_layer_depth=per_layer_depth,
                                text="TinyStories validation, bundled tokenizer")}
    deepest = max(depths)
    for init in INITS:
        per_layer, per_layer_std = {}, {}
        by_depth, by_depth_std = {"depths": list(depths)}, {}
        residual, residual_std = {"depth": deepest}, {}
        top, top_std = {"depths": list(depths)}, {}
        for variant, switches in VARIANTS.items():
            config = replace(base, **switches)
            rows, last, deepest_stream, top_of_stream = [], [], [], []
            for seed in range(seeds):
                models = {depth: build(replace(config, n_layer=depth), init, seed)
                          for depth in sorted({*depths, per_layer_depth})}
                grads = {depth: mlp_out_grad_norms(model, *batches[seed]) for depth, model in models.items()}
                rows.append(grads[per_layer_depth])
                last.append([grads[depth][-1] for depth in depths])
                streams = {depth: residual_sq_norms(models[depth], batches[seed][0]) for depth in depths}
                deepest_stream.append(streams[deepest])
                top_of_stream.append([streams[depth][-1] for depth in depths])
            per_layer[variant], per_layer_std[variant] = mean_std(rows)
            by_depth[variant], by_depth_std[variant] = mean_std(last)
            residual[variant], residual_std[variant] = mean_std(deepest_stream)
            top[variant], top_std[variant] = mean_std(top_of_stream)
        results[init] = {"per_layer": per_layer, "per_layer_std": per_layer_std,
                         "last_layer_by_depth": by_depth, "last_layer_by_depth_std": by_depth_std,
                         "residual_sq_norm": residual, "residual_sq_norm_std": residual_std,
                         # What ln_f divides by: the stream's norm at the top, by depth.
                         "top_residual_sq_norm_by_depth": top, "top_residual_sq_norm_by_depth_std": top_std}
    return results


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def format_gradnorm(results: dict) -> str:
    seeds = results["settings"]["seeds"]
    lines = []
    for init in INITS:
        r = results[init]
        layers = len(r["per_layer"]["pre"])
        lines.append(f"\n**{init} initialisation**: |grad mlp.c_proj| per layer ({layers} layers), "
                     f"mean ± std over {seeds} seeds\n")
        lines += markdown_table(["variant", *(f"layer {i + 1}" for i in range(layers))],
                                [[v, *(f"{m:.3g} ± {s:.2g}" for m, s in zip(r["per_layer"][v], r["per_layer_std"][v]))]
                                 for v in VARIANTS])
        depths = r["last_layer_by_depth"]["depths"]
        lines.append(f"\n**{init} initialisation**: |grad mlp.c_proj| of the last layer by depth\n")
        lines += markdown_table(["variant", *(f"L={d}" for d in depths)],
                                [[v, *(f"{m:.3g} ± {s:.2g}" for m, s in zip(r["last_layer_by_depth"][v],
                                                                              r["last_layer_by_depth_std"][v]))]
                                 for v in VARIANTS])
        lines.append(f"\n**{init} initialisation**: mean ||h||² at the top of the residual stream (what ln_f "
                     "normalises) by depth\n")
        lines += markdown_table(["variant", *(f"L={d}" for d in depths)],
                                [[v, *(f"{m:.3g} ± {s:.2g}" for m, s in zip(r["top_residual_sq_norm_by_depth"][v],
                                                                              r["top_residual_sq_norm_by_depth_std"][v]))]
                                 for v in VARIANTS])
        deepest = r["residual_sq_norm"]["depth"]
        lines.append(f"\n**{init} initialisation**: mean ||h||² of the residual stream after the embeddings (0) "
                     f"and after each layer, {deepest} layers\n")
        lines += markdown_table(["variant", *map(str, range(deepest + 1))],
                                [[v, *(f"{m:.3g}" for m in r["residual_sq_norm"][v])] for v in VARIANTS])
    return "\n".join(lines).strip() + "\n"


def pyplot():
    """matplotlib's pyplot, drawing to files; imported only here, since nothing else in model/ needs it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_gradnorm(results: dict, path: Path) -> None:
    save_figure(gradnorm_figure(results), path)


def gradnorm_figure(results: dict):
    fig, axes = pyplot().subplots(len(INITS), 3, figsize=(15, 4.6 * len(INITS)), squeeze=False)
    for row, init in zip(axes, INITS):
        r = results[init]
        for variant in VARIANTS:
            means, stds = r["per_layer"][variant], r["per_layer_std"][variant]
            row[0].errorbar(range(1, len(means) + 1), means, yerr=stds, marker="o", capsize=3, label=variant)
            row[1].errorbar(r["last_layer_by_depth"]["depths"], r["last_layer_by_depth"][variant],
                            yerr=r["last_layer_by_depth_std"][variant], marker="o", capsize=3, label=variant)
        depths = r["last_layer_by_depth"]["depths"]
        scale = r["last_layer_by_depth"]["pre"][0] * math.sqrt(depths[0])  # Xiong et al.'s Pre-LN prediction
        row[1].plot(depths, [scale / math.sqrt(depth) for depth in depths], "k:", label="∝ 1/√L, through pre's first")
        row[0].set(title=f"{init}: per layer, {len(means)}-layer model", xlabel="layer",
                   ylabel="|grad mlp.c_proj|", yscale="log")
        row[1].set(title=f"{init}: last layer by depth", xlabel="number of layers", ylabel="|grad mlp.c_proj|",
                   yscale="log")
        # Pre-LN alone: without ln_f the stream is the same, and Post-LN's is n_embd after every layer.
        row[2].plot(r["residual_sq_norm"]["pre"], marker=".", label="pre")
        row[2].set(title=f"{init}: Pre-LN residual stream (Lemma 2)", xlabel="after layer (0 = embeddings)",
                   ylabel="mean ||h||²", ylim=(0, None))
        for ax in row:  # the legend under the plot: wherever it goes inside, some series runs under it
            ax.grid(alpha=0.3)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small", frameon=False)
    fig.suptitle(f"Gradient norms at initialisation, mean ± std over {results['settings']['seeds']} seeds")
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def write_section(path: Path, name: str, text: str) -> None:
    """Put text between this command's markers in the Markdown file, leaving everything else."""
    begin, end = f"<!-- train.lab {name}: begin -->", f"<!-- train.lab {name}: end -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old + ("\n" if old else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


# --- train -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainGrid:
    """Every combination of variants x warmups x lrs x depths, each with seeds 0 .. seeds-1."""
    variants: tuple[str, ...] = tuple(VARIANTS)
    warmups: tuple[int, ...] = (0, 40)  # warmup steps; 0 = none
    # Xiong et al.'s Post-LN failed without warmup at 5e-4 and 1e-3 in a 512-wide model; a narrow
    # model tolerates larger steps, so the grid goes from their upper rate to three times it.
    lrs: tuple[float, ...] = (1e-3, 3e-3)
    depths: tuple[int, ...] = (6, 12)
    seeds: int = 3
    # Sized so the 72 runs take about an hour and a half on one core of this project's machine.
    steps: int = 200
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 64
    batch_size: int = 16
    init: str = "xavier"
    eval_every: int = 50
    val_windows: int = 16  # per source, from the start of each validation text
    train_chars: int | None = None  # only the first this many characters of each source (quick tests)

    def runs(self) -> list[dict]:
        return [dict(variant=v, warmup=w, lr=lr, depth=d, seed=s) for v in self.variants for w in self.warmups
                for lr in self.lrs for d in self.depths for s in range(self.seeds)]


def train_one(grid: TrainGrid, run: dict, train_data: dict, val_data: dict, tokenizer: Tokenizer, device) -> dict:
    """One run of the grid; returns run plus its loss curves, final validation loss and verdict."""
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=grid.block_size, n_embd=grid.n_embd,
                        n_head=grid.n_head, n_layer=run["depth"], eos_token_id=tokenizer.eos_id,
                        **VARIANTS[run["variant"]])
    model = build(config, grid.init, run["seed"]).to(device)
    settings = TrainSettings(max_steps=grid.steps, lr=run["lr"], warmup_steps=run["warmup"], grad_clip=None,
                             eval_every=grid.eval_every, seed=run["seed"])
    # Every source an equal share of each batch.
    next_batch = mixed_batches(train_data, dict.fromkeys(train_data, 1 / len(train_data)), grid.batch_size,
                               grid.block_size, run["seed"], device)

    def evaluate():
        return validation_loss(model, val_data, grid.block_size, device, max_windows=grid.val_windows)

    start_val, started = evaluate()["val_loss"], time.perf_counter()
    history = train(model, next_batch, settings, evaluate=evaluate, log=lambda record: None, progress=False)
    completed = len(history) == grid.steps and math.isfinite(history[-1]["loss"])
    final_val = history[-1]["val_loss"] if completed else math.nan
    return {**run, "train_loss": [round(r["loss"], 4) for r in history],
            "val_loss": [[0, start_val], *([r["step"], r["val_loss"]] for r in history if "val_loss" in r)],
            "final_val_loss": final_val, "diverged": not math.isfinite(final_val) or final_val > start_val,
            "seconds": round(time.perf_counter() - started, 1)}


def json_safe(value):
    """NaN and infinity as null: they are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


RUN_KEYS = ("variant", "warmup", "lr", "depth", "seed")  # what names a run within a grid
GRID_AXES = tuple(key + "s" for key in RUN_KEYS)  # the TrainGrid fields that list each one's values


def run_key(run: dict) -> tuple:
    return tuple(run[k] for k in RUN_KEYS)


def run_grid(grid: TrainGrid, json_path: Path | None = None, device: str = "auto",
             parts: tuple[Path, ...] = ()) -> dict:
    """Every run of the grid, resuming from json_path's runs when it holds the same grid, and
    taking finished runs from `parts`: files of grids that differ from this one in their axes
    only (e.g. one per learning rate, run in parallel)."""
    settings = json_safe(asdict(grid))
    results = {"settings": settings, "runs": []}
    if json_path and json_path.exists():
        previous = json.loads(json_path.read_text())
        if previous["settings"] != settings:
            raise SystemExit(f"{json_path} holds a different grid; give another --json or delete it")
        results = previous
    runs = grid.runs()
    order = {run_key(run): i for i, run in enumerate(runs)}
    done = {run_key(r) for r in results["runs"]}
    for part in parts:
        other = json.loads(part.read_text())
        if any(other["settings"][k] != v for k, v in settings.items() if k not in GRID_AXES):
            raise SystemExit(f"{part} was trained with other settings than this grid")
        for r in other["runs"]:
            if run_key(r) in order and run_key(r) not in done:
                results["runs"].append(r)
                done.add(run_key(r))
    results["runs"].sort(key=lambda r: order.get(run_key(r), len(order)))
    todo = [run for run in runs if run_key(run) not in done]
    if not todo:
        return results
    tokenizer = bundled_tokenizer()
    train_data = pretraining_streams(tokenizer, "train", grid.train_chars)
    val_data = pretraining_streams(tokenizer, "val")
    target = pick_device(device)
    for i, run in enumerate(todo, 1):
        record = train_one(grid, run, train_data, val_data, tokenizer, target)
        results["runs"].append(json_safe(record))
        final = record["final_val_loss"]
        print(f"[{i}/{len(todo)}] {run}: final val loss {final:.3f}{' DIVERGED' if record['diverged'] else ''}"
              f" ({record['seconds']:.0f} s)", flush=True)
        if json_path:
            write_json(json_path, results)
    return results


def grid_cells(results: dict) -> dict[tuple, list[dict]]:
    """Runs grouped by (variant, warmup, lr, depth), seeds together."""
    cells: dict[tuple, list[dict]] = {}
    for r in results["runs"]:
        cells.setdefault(run_key(r)[:-1], []).append(r)  # all but the seed
    return cells


def val_loss_at(run: dict, step: int) -> float | None:
    return next((loss for s, loss in run["val_loss"] if s == step), None)


def format_training(results: dict) -> str:
    s = results["settings"]
    halfway = s["steps"] // 2 // s["eval_every"] * s["eval_every"]

    def mean_sd(values):
        values = [v for v in values if v is not None and math.isfinite(v)]
        if not values:
            return "–"
        mean, std = mean_and_std(values)
        return f"{mean:.3f}" + (f" ± {std:.3f}" if len(values) > 1 else "")

    rows = []
    for (variant, warmup, lr, depth), runs in grid_cells(results).items():
        kept = [r for r in runs if not r["diverged"]]
        rows.append([variant, str(warmup) if warmup else "none", f"{lr:g}", str(depth),
                     mean_sd(val_loss_at(r, halfway) for r in kept), mean_sd(r["final_val_loss"] for r in kept),
                     f"{len(runs) - len(kept)}/{len(runs)}"])
    intro = (f"{s['steps']} steps of {s['batch_size']} x {s['block_size']} tokens, width {s['n_embd']}, "
             f"{s['init']} initialisation, gradient clipping off, AdamW with cosine decay; validation loss "
             f"(nats/token) mean ± std over the runs that did not diverge.\n\n")
    header = ["variant", "warmup steps", "lr", "layers", f"val loss at step {halfway}", "final val loss",
              "diverged"]
    return intro + "\n".join(markdown_table(header, rows)) + "\n"


def plot_training(results: dict, path: Path) -> None:
    plt = pyplot()
    s = results["settings"]
    colors = dict(zip(VARIANTS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(sorted(s["warmups"], reverse=True), ["-", "--", ":", "-."]))
    smooth = max(1, s["steps"] // 25)
    fig, axes = plt.subplots(len(s["depths"]), len(s["lrs"]), figsize=(6 * len(s["lrs"]), 4 * len(s["depths"])),
                             squeeze=False)
    lowest = math.inf
    for (variant, warmup, lr, depth), runs in grid_cells(results).items():
        ax = axes[s["depths"].index(depth)][s["lrs"].index(lr)]
        curves = np.full((len(runs), s["steps"]), np.nan)  # a diverged run stops early: the rest stays NaN
        for i, r in enumerate(runs):
            curves[i, :len(r["train_loss"])] = [np.nan if v is None else v for v in r["train_loss"]]
        with warnings.catch_warnings():  # steps after every seed stopped are all NaN: not drawn, as meant
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(curves, axis=0)
        smoothed = np.convolve(median, np.ones(smooth) / smooth, mode="valid")
        lowest = min(lowest, np.nanmin(smoothed, initial=math.inf))
        diverged = sum(r["diverged"] for r in runs)
        ax.plot(np.arange(smooth, s["steps"] + 1), smoothed, color=colors[variant], linestyle=styles[warmup],
                label=f"{variant}, warmup {warmup or 'none'}" + (f" ({diverged}/{len(runs)} diverged)" if diverged else ""))
    # Up to a little above the loss at initialisation: a diverging curve leaves the panel, its label says so.
    start = max(r["val_loss"][0][1] for r in results["runs"])
    for ax, (depth, lr) in zip(axes.flat, [(d, lr) for d in s["depths"] for lr in s["lrs"]]):
        ax.set(title=f"{depth} layers, lr {lr:g}", xlabel="step", ylabel="training loss (median over seeds)",
               ylim=(min(lowest, start) - 0.2, start + 0.5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Pre-LN vs Post-LN training, no gradient clipping ({s['seeds']} seeds, {s['init']} init)")
    save_figure(fig, path)


# --- steering ----------------------------------------------------------------------------------

# Happy minus sad, in the words of the stories the lab models read.
STEERING_POSITIVE = ("She was very happy and loved to play with her friends.", "The day was sunny and fun.",
                     "Tom smiled and laughed.", "I love my new toy, it is great!")
STEERING_NEGATIVE = ("She was very sad and did not want to play with her friends.", "The day was dark and scary.",
                     "Tom cried and shouted.", "I hate my old toy, it is bad!")
STEERING_PROMPTS = ("Once upon a time, there was a little girl named Lily. She felt",
                    "The dog ran to the park and", "Tom looked at the sky and said", "Mom gave Ben a big",
                    "One day, a little bird", "The old man opened the door and")


@dataclass(frozen=True)
class SteeringLab:
    variants: tuple[str, ...] = ("pre", "post")
    seeds: int = 3
    n_layer: int = 6
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 64
    batch_size: int = 8
    # Of training before measuring (0: at initialisation); sized so the 6 models train in about 5
    # minutes on 2 CPU cores: the 8192-token head is most of a step.
    steps: int = 120
    lr: float = 2e-3
    init: str = "gpt2"
    relative_strength: float = 1.0  # c: strength * |v| = c * the typical residual norm at the layer
    train_chars: int = 1_000_000  # of each pretraining source


@torch.no_grad()
def next_token_log_probs(model: GPT2, prompts: list[list[int]]) -> torch.Tensor:
    """(prompts, vocab): log p of the token after each prompt, in float64."""
    return torch.stack([model(torch.tensor([ids]), last_only=True)[0, -1].double().log_softmax(-1)
                        for ids in prompts])


def steering_kl_by_layer(model: GPT2, tokenizer: Tokenizer, relative_strength: float,
                         positive=STEERING_POSITIVE, negative=STEERING_NEGATIVE,
                         prompts=STEERING_PROMPTS) -> dict[str, list[float]]:
    """For each layer L = 0 .. n_layer: the vector's norm, the typical residual norm there, and the
    mean over prompts of KL(steered || unsteered) of the next token, steered at L with strength
    relative_strength * typical / |v|. And, unsteered, the mean KL between two prompts' next tokens."""
    ids = [tokenizer.encode(prompt) for prompt in prompts]
    plain = next_token_log_probs(model, ids)
    # How much the unsteered output depends on the input at all: the mean KL between two prompts'.
    between = (plain.exp()[:, None] * (plain[:, None] - plain[None, :])).sum(-1)
    prompt_kl = float(between.sum() / (len(ids) * (len(ids) - 1)))
    kls, vector_norms, residual_norms = [], [], []
    for layer in range(model.config.n_layer + 1):
        vector, typical = steering_vector(model, tokenizer, list(positive), list(negative), layer)
        norm = float(vector.norm())
        with steered(model, Steering(layer, vector, relative_strength * typical / norm)):
            log_p = next_token_log_probs(model, ids)
        kls.append(float((log_p.exp() * (log_p - plain)).sum(-1).mean()))
        vector_norms.append(norm)
        residual_norms.append(typical)
    return {"kl": kls, "vector_norm": vector_norms, "residual_norm": residual_norms, "prompt_kl": prompt_kl}


def lab_model(lab: SteeringLab, variant: str, seed: int, tokenizer: Tokenizer,
              train_data: dict | None) -> tuple[GPT2, float | None]:
    """A model of the lab, trained lab.steps steps on the pretraining prose (warmup and clipping on:
    this asks what steering does to a model that trained, not whether it trains), and its last
    training loss (None: untrained)."""
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=lab.block_size, n_embd=lab.n_embd,
                        n_head=lab.n_head, n_layer=lab.n_layer, eos_token_id=tokenizer.eos_id, **VARIANTS[variant])
    model = build(config, lab.init, seed)
    if not lab.steps:
        return model.eval(), None
    settings = TrainSettings(max_steps=lab.steps, lr=lab.lr, warmup_steps=lab.steps // 5, seed=seed)
    next_batch = mixed_batches(train_data, dict.fromkeys(train_data, 1 / len(train_data)), lab.batch_size,
                               lab.block_size, seed, "cpu")
    history = train(model, next_batch, settings, log=lambda record: None, progress=False)
    return model.eval(), round(history[-1]["loss"], 4)


def steering_kl(lab: SteeringLab = SteeringLab()) -> dict:
    """The measurements, as the JSON `python -m train.lab steering --json` writes: per variant, the
    KL of every seed at every layer, their mean and std, and the norms behind the strengths."""
    tokenizer = bundled_tokenizer()
    train_data = pretraining_streams(tokenizer, "train", lab.train_chars) if lab.steps else None
    results = {"settings": {**asdict(lab), "positive": STEERING_POSITIVE, "negative": STEERING_NEGATIVE,
                            "prompts": STEERING_PROMPTS, "kl": "KL(steered || unsteered), nats, next token after "
                                                               "each prompt, mean over prompts"},
               "layers": list(range(lab.n_layer + 1))}
    for variant in lab.variants:
        runs = []
        for seed in range(lab.seeds):
            model, final_loss = lab_model(lab, variant, seed, tokenizer, train_data)
            runs.append({"seed": seed, "final_train_loss": final_loss,
                         **steering_kl_by_layer(model, tokenizer, lab.relative_strength)})
        mean, std = mean_std([run["kl"] for run in runs])
        results[variant] = {"kl_mean": mean, "kl_std": std, "runs": runs}
    return results


def format_steering(results: dict) -> str:
    s = results["settings"]
    trained = f"trained {s['steps']} steps on the pretraining prose" if s["steps"] else "at initialisation"
    lines = [f"{s['n_layer']} layers, width {s['n_embd']}, {s['init']} initialisation, {trained}; strength * |v| = "
             f"{s['relative_strength']:g} × the typical residual norm at the layer. KL(steered ‖ unsteered) of the "
             f"next token (nats), mean over {len(s['prompts'])} prompts, mean ± std over {s['seeds']} seeds.\n"]
    lines += markdown_table(["variant", *(f"after {'embeddings' if L == 0 else f'block {L}'}" for L in results["layers"])],
                            [[v, *(f"{m:.3g} ± {sd:.2g}" for m, sd in zip(results[v]["kl_mean"], results[v]["kl_std"]))]
                             for v in s["variants"]])
    lines.append("\nUnsteered, the mean KL between two prompts' next-token distributions (how much the output "
                 "depends on the input at all): " + ", ".join(
                     f"{v} {statistics.fmean(r['prompt_kl'] for r in results[v]['runs']):.3g}" for v in s["variants"]))
    lines.append("\nTypical residual norm at each layer (mean over seeds), what the strength is relative to:\n")
    lines += markdown_table(["variant", *map(str, results["layers"])],
                            [[v, *(f"{m:.3g}" for m in mean_std([r["residual_norm"] for r in results[v]["runs"]])[0])]
                             for v in s["variants"]])
    return "\n".join(lines) + "\n"


def plot_steering(results: dict, path: Path) -> None:
    s = results["settings"]
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for variant in s["variants"]:
        ax.errorbar(results["layers"], results[variant]["kl_mean"], yerr=results[variant]["kl_std"], marker="o",
                    capsize=3, label=variant)
    ax.set(xlabel="steered after block L (0 = after the embeddings)", ylabel="KL(steered ‖ unsteered), nats",
           yscale="log", xticks=results["layers"],
           title=f"One steering vector at {s['relative_strength']:g}× the residual norm, {s['seeds']} seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


# --- command line ------------------------------------------------------------------------------

def write_json(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(results), indent=1) + "\n")


def save_outputs(results: dict, args, plot, formatted: str, section: str) -> None:
    print(formatted)
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(results, args.plot)
    if args.markdown:
        write_section(args.markdown, section, formatted)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m train.lab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    g = commands.add_parser("gradnorm", help="gradient norms at initialisation (Xiong et al. 2020, Figure 3)")
    g.add_argument("--seeds", type=int, default=5, help="initialisations (and text batches) averaged over")
    g.add_argument("--n-embd", type=int, default=256, help="model width")
    g.add_argument("--n-head", type=int, default=8, help="attention heads")
    g.add_argument("--block-size", type=int, default=128, help="tokens per sequence")
    g.add_argument("--batch-size", type=int, default=8, help="sequences per batch")
    g.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS), help="depths for the last-layer series")
    g.add_argument("--per-layer-depth", type=int, default=6, help="depth of the model measured layer by layer")

    t = commands.add_parser("train", help="Pre-LN vs Post-LN training runs, with and without warmup")
    d = TrainGrid()
    t.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(d.variants))
    t.add_argument("--warmups", type=int, nargs="+", default=list(d.warmups), help="warmup steps (0 = none)")
    t.add_argument("--lrs", type=float, nargs="+", default=list(d.lrs), help="peak learning rates")
    t.add_argument("--depths", type=int, nargs="+", default=list(d.depths), help="numbers of layers")
    t.add_argument("--seeds", type=int, default=d.seeds, help="runs per cell, seeds 0 .. N-1")
    t.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per run")
    t.add_argument("--n-embd", type=int, default=d.n_embd, help="model width")
    t.add_argument("--n-head", type=int, default=d.n_head, help="attention heads")
    t.add_argument("--block-size", type=int, default=d.block_size, help="tokens per sequence")
    t.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step")
    t.add_argument("--init", choices=INITS, default=d.init, help="initialisation (see above)")
    t.add_argument("--eval-every", type=int, default=d.eval_every, help="validate every N steps")
    t.add_argument("--val-windows", type=int, default=d.val_windows, help="validation windows per source")
    t.add_argument("--train-chars", type=int, default=None,
                   help="train on only the first N characters of each source (quick tests)")
    t.add_argument("--device", default="auto", help="cpu, cuda or auto")
    t.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
    t.add_argument("--parts", type=Path, nargs="+", default=[],
                   help="JSON files of runs to take instead of training them again: parts of this grid run "
                        "in parallel (each with a subset of --variants, --warmups, --lrs or --depths)")
    st = commands.add_parser("steering", help="KL of one steering vector injected at each layer, Pre-LN vs Post-LN")
    ds = SteeringLab()
    st.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(ds.variants))
    st.add_argument("--seeds", type=int, default=ds.seeds, help="models per variant, seeds 0 .. N-1")
    st.add_argument("--n-layer", type=int, default=ds.n_layer, help="number of layers")
    st.add_argument("--n-embd", type=int, default=ds.n_embd, help="model width")
    st.add_argument("--n-head", type=int, default=ds.n_head, help="attention heads")
    st.add_argument("--block-size", type=int, default=ds.block_size, help="tokens per training sequence")
    st.add_argument("--batch-size", type=int, default=ds.batch_size, help="sequences per training step")
    st.add_argument("--steps", type=int, default=ds.steps, help="training steps before measuring (0: at initialisation)")
    st.add_argument("--lr", type=float, default=ds.lr, help="peak learning rate")
    st.add_argument("--init", choices=INITS, default=ds.init, help="initialisation (see above)")
    st.add_argument("--relative-strength", type=float, default=ds.relative_strength,
                    help="c: strength * |v| = c * the typical residual norm at the layer")
    st.add_argument("--train-chars", type=int, default=ds.train_chars, help="characters of each pretraining source")
    for command in (g, t, st):
        command.add_argument("--json", type=Path, help="write the results to this JSON file"
                             + (" (and resume from it)" if command is t else ""))
        command.add_argument("--plot", type=Path, help="draw the results into this PNG file")
        command.add_argument("--markdown", type=Path, help="write the tables into this command's section of this file")
    args = p.parse_args(argv)

    if args.command == "gradnorm":
        results = gradnorm(args.seeds, args.n_embd, args.n_head, args.block_size, args.batch_size, args.depths,
                           args.per_layer_depth)
        save_outputs(results, args, plot_gradnorm, format_gradnorm(results), "gradnorm")
    elif args.command == "steering":
        lab = SteeringLab(tuple(args.variants), args.seeds, args.n_layer, args.n_embd, args.n_head, args.block_size,
                          args.batch_size, args.steps, args.lr, args.init, args.relative_strength, args.train_chars)
        results = steering_kl(lab)
        save_outputs(results, args, plot_steering, format_steering(results), "steering")
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        grid = TrainGrid(tuple(args.variants), tuple(args.warmups), tuple(args.lrs), tuple(args.depths), args.seeds,
                         args.steps, args.n_embd, args.n_head, args.block_size, args.batch_size, args.init,
                         args.eval_every, args.val_windows, args.train_chars)
        results = run_grid(grid, args.json, args.device, tuple(args.parts))
        save_outputs(results, args, plot_training, format_training(results), "train")


if __name__ == "__main__":
    main()

"""Training: one loop for pretraining (this module's CLI), adapter fine-tuning and the lab runs.

    python -m train.pretrain --out runs/bundled --max-steps 3000

AdamW with linear warmup and cosine decay, gradient clipping, a tqdm bar with loss and tokens/s,
periodic validation, checkpoint and resume, a fixed seed, CPU or CUDA picked automatically.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

IGNORE = -100  # label value that takes no part in the loss (prompt tokens, padding)


@dataclass
class TrainSettings:
    max_steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0  # None: no clipping (the Pre-LN vs Post-LN runs)
    eval_every: int = 200
    save_every: int = 500
    seed: int = 1337
    bf16: bool = False  # bf16 autocast for the forward pass; the weights and AdamW stay fp32
    compile: bool = False  # run the forward pass through torch.compile


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively here: a CUDA GPU that has them, or a CPU with
    AVX512-BF16 or AMX. Elsewhere bf16 is emulated and many times slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def add_precision_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                        help="bf16 autocast or plain fp32; auto picks bf16 where the device runs it natively")


def pick_bf16(precision: str, device: torch.device) -> bool:
    """--precision's choice, said aloud: a run's log shows which arithmetic it trained in."""
    bf16 = precision == "bf16" or (precision == "auto" and native_bf16(device))
    reason = "" if precision != "auto" else " (auto: native bf16 here)" if bf16 else " (auto: no native bf16 here)"
    print(f"device {device}, {'bf16 autocast' if bf16 else 'fp32'}{reason}")
    return bf16


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(step: int, s: TrainSettings) -> float:
    """Linear warmup to s.lr, then cosine decay to s.lr * s.min_lr_ratio at s.max_steps."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: nn.Module, s: TrainSettings) -> torch.optim.AdamW:
    """AdamW; matrices decay, biases, LayerNorm gains and the embeddings' 1-D parts don't."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)


def train(model: nn.Module, next_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], s: TrainSettings,
          evaluate: Callable[[], dict[str, float]] | None = None, save: Callable[[int, torch.optim.Optimizer], None] | None = None,
          optimizer: torch.optim.Optimizer | None = None, start_step: int = 0, log: Callable[[dict], None] = print,
          progress: bool = True, stop_at: int | None = None) -> list[dict]:
    """Train from start_step to s.max_steps (or to stop_at, where the schedule goes on to
    s.max_steps when resumed); returns the history of logged records.

    next_batch(step) gives (inputs, labels) with labels already shifted (IGNORE where unscored);
    evaluate() gives named validation losses, logged every s.eval_every steps.
    """
    optimizer = optimizer or make_optimizer(model, s)
    history = []
    end = s.max_steps if stop_at is None else min(stop_at, s.max_steps)
    bar = tqdm(range(start_step, end), initial=start_step, total=s.max_steps, disable=not progress,
               dynamic_ncols=True)
    tokens, started = 0, time.perf_counter()
    model.train()
    forward = torch.compile(model) if s.compile else model
    for step in bar:
        lr = learning_rate(step, s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = next_batch(step)
        loss = lm_loss(forward, x, y, s.bf16)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
                     if s.grad_clip else None)
        optimizer.step()
        tokens += int((y != IGNORE).sum())
        tok_s = tokens / (time.perf_counter() - started)
        record = {"step": step + 1, "loss": loss.item(), "lr": lr, "tokens_per_s": tok_s}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{tok_s:.0f}")
        last = step + 1 == end
        if evaluate and (last or (step + 1) % s.eval_every == 0):
            model.eval()
            record.update(evaluate())
            model.train()
            log({k: round(v, 5) if isinstance(v, float) else v for k, v in record.items()})
        history.append(record)
        if save and (last or (step + 1) % s.save_every == 0):
            save(step + 1, optimizer)
        if not math.isfinite(record["loss"]):
            log({"step": step + 1, "stopped": "loss is not finite"})
            break
    model.eval()
    return history


def seconds_per_step(model: nn.Module, next_batch, s: TrainSettings, steps: int = 4) -> float:
    """Time a few training steps of the loop on a copy of the model (the first, which warms up,
    not counted), plus a share for validation and checkpoints."""
    probe = copy.deepcopy(model)
    optimizer = make_optimizer(probe, s)
    train(probe, next_batch, replace(s, max_steps=1), optimizer=optimizer, progress=False)
    started = time.perf_counter()
    train(probe, next_batch, replace(s, max_steps=steps), optimizer=optimizer, start_step=1, progress=False)
    return (time.perf_counter() - started) / (steps - 1) * 1.03


# --- pretraining CLI ---------------------------------------------------------------------------

def token_stream(documents: list[str], tokenizer) -> torch.Tensor:
    """All documents as one tensor of ids, each document followed by EOS."""
    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer.encode(doc))
        ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.int32)


def random_windows(data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator,
                   device) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - block_size - 1, (batch_size,), generator=generator)
    chunk = torch.stack([data[i:i + block_size + 1] for i in starts.tolist()]).long()
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


@torch.no_grad()
def mean_loss(model: nn.Module, data: torch.Tensor, block_size: int, device, max_windows: int = 64,
              batch_size: int = 16) -> float:
    """Mean next-token loss over consecutive windows from the start of data (deterministic)."""
    n = min(max_windows, (len(data) - 1) // block_size)
    windows = data[: n * block_size + 1]
    losses = []
    for i in range(0, n, batch_size):
        rows = range(i, min(n, i + batch_size))
        x = torch.stack([windows[r * block_size:(r + 1) * block_size] for r in rows]).long().to(device)
        y = torch.stack([windows[r * block_size + 1:(r + 1) * block_size + 1] for r in rows]).long().to(device)
        losses.append(lm_loss(model, x, y).item() * len(rows))
    return sum(losses) / n


def pretraining_streams(tokenizer, split: str, chars: int | None = None) -> dict[str, torch.Tensor]:
    """The token stream of each pretraining source (train/corpus.py) in split "train" or "val";
    `chars` keeps only the first characters of each source (quick tests)."""
    from .corpus import pretrain_sources

    return {name: token_stream(docs if chars is None else ["".join(docs)[:chars]], tokenizer)
            for name, docs in pretrain_sources(split).items()}


def mix_streams(tokenizer, weights: dict[str, float]) -> dict[str, torch.Tensor]:
    """The training token stream of each source the mix draws on (PRETRAIN_SOURCES)."""
    streams = {name: data for name, data in pretraining_streams(tokenizer, "train").items() if name in weights}
    task_sources = [name for name in weights if name not in streams]
    if task_sources:
        # The task formats come from the tasks' own training splits (the tasks package owns the
        # splits; this is the one place training reads them).
        from .data import pretraining_documents
        documents = pretraining_documents()
        streams.update({name: token_stream(documents[name], tokenizer) for name in task_sources})
    return streams


def rows_per_source(batch_size: int, weights: dict[str, float], generator: torch.Generator) -> dict[str, int]:
    """Each source gets the whole part of its share of the batch's rows; the rows left over go to
    sources drawn by the fractions left, so a 3% source gets its 3% over many steps."""
    total = sum(weights.values())
    exact = {name: batch_size * w / total for name, w in weights.items()}
    rows = {name: int(e) for name, e in exact.items()}
    left = batch_size - sum(rows.values())
    if left:
        names = list(exact)
        remainders = torch.tensor([exact[name] - rows[name] for name in names], dtype=torch.float64)
        for i in torch.multinomial(remainders, left, replacement=False, generator=generator).tolist():
            rows[names[i]] += 1
    return rows


def mixed_batches(train_data: dict[str, torch.Tensor], weights: dict[str, float], batch_size: int, block_size: int,
                  seed: int, device) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """next_batch(step): random windows of each source, rows in proportion to weights. The batches
    are a function of seed and step alone, so a resumed run sees the batches it would have seen,
    and the lab's variants of one seed train on the same text."""
    generator = torch.Generator()

    def next_batch(step: int):
        generator.manual_seed(seed * 1_000_003 + step)
        rows = rows_per_source(batch_size, weights, generator)
        parts = [random_windows(train_data[name], n, block_size, generator, device) for name, n in rows.items() if n > 0]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
    return next_batch


def validation_loss(model: nn.Module, val_data: dict[str, torch.Tensor], block_size: int, device,
                    **mean_loss_options) -> dict[str, float]:
    """Mean loss on each source's validation stream (val_<source>) and their mean (val_loss)."""
    losses = {f"val_{name}": mean_loss(model, data, block_size, device, **mean_loss_options)
              for name, data in val_data.items()}
    return {"val_loss": sum(losses.values()) / len(losses), **losses}


PRETRAIN_SOURCES = {
    "tinystories": "TinyStories stories",
    "gutenberg": "Gutenberg children's classics",
    "translation": "Tatoeba pairs as `source = target` lines, English<->French and English<->German",
    "dialogue": "speaker-tagged transcripts (User: / Bot:)",
    "summaries": "article, TL;DR: and summary (Aesop fable -> lesson, derived dialogue summaries)",
}
# Prose first, as the model's English comes from it; translation next, as French and German have
# nothing else to come from; the small summary set is kept to a few passes over it.
DEFAULT_MIX = {"tinystories": 0.33, "gutenberg": 0.32, "translation": 0.22, "dialogue": 0.10, "summaries": 0.03}


def mix_share(text: str) -> tuple[str, float]:
    name, _, share = text.partition("=")
    if name not in PRETRAIN_SOURCES:
        raise argparse.ArgumentTypeError(f"unknown source {name!r}; sources: {', '.join(PRETRAIN_SOURCES)}")
    try:
        value = float(share)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected SOURCE=SHARE, e.g. translation=0.2") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share cannot be negative")
    return name, value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.pretrain", description=(
        "Pretrain a Pre-LN GPT-2 from scratch on the prose in ../shared/data/pretrain "
        "(Gutenberg children's classics and TinyStories), with a SentencePiece tokenizer. "
        "Writes an HF-layout checkpoint (config.json, model.safetensors, tokenizer.model) to --out."))
    p.add_argument("--out", type=Path, required=True, help="output directory for checkpoints and logs")
    p.add_argument("--text", type=Path, default=None,
                   help="train on this UTF-8 text file instead of the pretraining corpus (its last 10%% validates)")
    p.add_argument("--tokenizer", type=Path, default=Path("assets/tokenizer.model"),
                   help="SentencePiece model to tokenize with (train one with scripts/train_tokenizer.py)")
    p.add_argument("--n-layer", type=int, default=6, help="number of transformer blocks")
    p.add_argument("--n-embd", type=int, default=256, help="width of the residual stream")
    p.add_argument("--n-head", type=int, default=8, help="attention heads per block")
    p.add_argument("--block-size", type=int, default=None,
                   help="context window (n_positions) and training length (default: 256, or --init's context)")
    p.add_argument("--norm-position", choices=["pre", "post"], default="pre", help="Pre-LN (GPT-2) or Post-LN block")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per optimizer step")
    p.add_argument("--mix", nargs="+", type=mix_share, default=list(DEFAULT_MIX.items()), metavar="SOURCE=SHARE",
                   help="share of the batches' rows per source: " + ", ".join(PRETRAIN_SOURCES) +
                        " (default: " + " ".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items()) + ")")
    p.add_argument("--max-steps", type=int, default=3000, help="optimizer steps; the cosine schedule ends here")
    p.add_argument("--minutes", type=float, default=None,
                   help="train for about this long instead of --max-steps: the step count (and so the cosine "
                        "schedule) comes from a few timed steps at the start")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final learning rate as a fraction of --lr")
    p.add_argument("--warmup-steps", type=int, default=200, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    p.add_argument("--eval-every", type=int, default=250, help="validate every N steps")
    p.add_argument("--save-every", type=int, default=500, help="write a resumable checkpoint every N steps")
    p.add_argument("--seed", type=int, default=1337, help="seed for initialisation and batch sampling")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="end this run at this step with a checkpoint; --resume goes on to --max-steps")
    p.add_argument("--init", default=None, metavar="MODEL",
                   help="start from these weights (\"bundled\", a checkpoint folder or an HF GPT-2 name) with a "
                        "fresh optimizer, warm-up and schedule; the size flags are then ignored")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile the forward pass; auto: on CUDA only, as on a CPU it gained nothing "
                        "(python -m bench.train measures it)")
    add_precision_flag(p)
    return p.parse_args(argv)


TRAINING_RECORD = "training.json"  # a checkpoint's pretraining runs, oldest first, and all the tokens they saw


def earlier_training(name: str) -> list[dict]:
    """The runs a checkpoint already went through (its training.json), so a continued run counts
    every token the weights have seen; [] for a checkpoint without one (a hub model)."""
    from model.checkpoint import BUNDLED_DIR

    folder = BUNDLED_DIR if name == "bundled" else Path(name)
    record = folder / TRAINING_RECORD
    return json.loads(record.read_text())["runs"] if record.is_file() else []


def training_data(args: argparse.Namespace, tokenizer) -> tuple[dict, dict, dict[str, float]]:
    """The training and validation token streams by source, and each source's share of the rows:
    the user's own --text (its last tenth validates), or the --mix of the project's sources."""
    if args.text:
        data = token_stream([args.text.read_text(encoding="utf-8")], tokenizer)
        split = int(len(data) * 0.9)
        train_data, val_data, weights = {"text": data[:split]}, {"text": data[split:]}, {"text": 1.0}
    else:
        weights = {name: share for name, share in dict(args.mix).items() if share > 0}
        train_data = mix_streams(tokenizer, weights)
        val_data = {name: data for name, data in pretraining_streams(tokenizer, "val").items() if name in weights}
    for name, data in train_data.items():
        held_out = f"  val tokens {len(val_data[name]):,}" if name in val_data else ""
        print(f"{name}: {weights[name]:.0%} of rows, train tokens {len(data):,}{held_out}")
        if min(len(data), len(val_data.get(name, data))) < args.block_size + 2:
            raise SystemExit(f"{name}: too little text for --block-size {args.block_size}")
    return train_data, val_data, weights


def starting_model(args: argparse.Namespace, init, tokenizer, device: torch.device):
    """The model training starts from, and the saved training state where it resumes (else None):
    --out's last save with --resume, --init's weights, or a new model of the asked shape."""
    from model.checkpoint import load_pretrained
    from model.config import GPT2Config
    from model.gpt2 import GPT2

    state_path = args.out / "train_state.pt"
    if args.resume and state_path.is_file():
        model, _ = load_pretrained(args.out, device=device)
        return model, torch.load(state_path, map_location="cpu", weights_only=True)
    if init is not None:
        model = GPT2(init.config).to(device)  # the base weights alone, without the adapters' hooks
        model.load_state_dict(init.state_dict())
        if model.config.n_positions < args.block_size:
            raise SystemExit(f"--init {args.init}: context {model.config.n_positions} < --block-size {args.block_size}")
        return model, None
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=args.block_size, n_embd=args.n_embd,
                        n_layer=args.n_layer, n_head=args.n_head, eos_token_id=tokenizer.eos_id,
                        norm_position=args.norm_position)
    return GPT2(config).to(device), None


def main(argv=None) -> None:
    from model.checkpoint import load_pretrained, pick_device, save_pretrained
    from model.tokenizer import SentencePieceTokenizer

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    seed_everything(args.seed)
    tokenizer = SentencePieceTokenizer.from_file(args.tokenizer)
    init, history = None, []
    if args.init and not (args.resume and (args.out / "train_state.pt").is_file()):
        init, tokenizer = load_pretrained(args.init, device=device)  # the tokenizer goes with the weights
        history = earlier_training(args.init)
    if args.block_size is None:
        recorded = args.out / "train_args.json"
        args.block_size = (json.loads(recorded.read_text())["block_size"] if args.resume and recorded.is_file()
                           else init.config.n_positions if init is not None else 256)
    train_data, val_data, weights = training_data(args, tokenizer)
    bf16 = pick_bf16(args.precision, device)
    compiled = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    print(f"torch.compile {'on' if compiled else 'off'}" + (f" (auto on {device.type})" if args.compile == "auto" else ""))
    settings = TrainSettings(bf16=bf16, compile=compiled, max_steps=args.max_steps, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
                             warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                             grad_clip=args.grad_clip or None, eval_every=args.eval_every,
                             save_every=args.save_every, seed=args.seed)
    state_path = args.out / "train_state.pt"
    model, state = starting_model(args, init, tokenizer, device)
    start_step = 0 if state is None else state["step"]
    optimizer = make_optimizer(model, settings)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        print(f"resumed at step {start_step}")
    print(f"parameters {model.num_parameters():,}")

    next_batch = mixed_batches(train_data, weights, args.batch_size, args.block_size, args.seed, device)
    if args.minutes and start_step == 0:
        seconds = seconds_per_step(model, next_batch, settings)
        settings.max_steps = max(settings.warmup_steps + 1, int(args.minutes * 60 / seconds))
        print(f"{seconds:.2f} s per step: {settings.max_steps} steps in {args.minutes:g} minutes")
    elif args.minutes:
        settings.max_steps = json.loads((args.out / "train_args.json").read_text())["max_steps"]

    def evaluate():
        return validation_loss(model, val_data, args.block_size, device)

    if state is not None:
        history = json.loads((args.out / TRAINING_RECORD).read_text())["runs"][:-1]

    def save(step, opt):
        save_pretrained(model, tokenizer, args.out)
        torch.save({"step": step, "optimizer": opt.state_dict()}, state_path)
        this_run = {"init": args.init, "steps": step, "tokens": step * args.batch_size * args.block_size,
                    "mix": weights, "bf16": settings.bf16}
        runs = history + [this_run]
        (args.out / TRAINING_RECORD).write_text(json.dumps(
            {"tokens_seen": sum(run["tokens"] for run in runs), "runs": runs}, indent=2) + "\n")

    log_path = args.out / "log.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_args.json").write_text(json.dumps(
        {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **asdict(settings)}, indent=2))

    def log(record):
        tqdm.write(json.dumps(record))
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    train(model, next_batch, settings, evaluate=evaluate,
          save=save, optimizer=optimizer, start_step=start_step, log=log, stop_at=args.stop_after)


if __name__ == "__main__":
    main()

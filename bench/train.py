"""Training speed: our whole training loop against the bare step, side by side in one run.

    python -m bench.train [--rounds 3] [--steps 10] [--json PATH]

The bundled model's configuration (assets/config.json) at the batch shape `train.pretrain` uses
(8 x 512), random initial weights. The "bare step" is the yardstick: the same model in eager
fp32, one fixed batch, forward, cross-entropy, backward, `torch.optim.AdamW` with its defaults,
nothing else. "Our loop" is `train.train` as `python -m train.pretrain` runs it, with the setting
`train.pretrain` picks here: batches cut from the real mix, gradient clipping, the schedule,
logging; its validation and checkpoint are timed once per round and counted at the frequency
the pretraining run has them (every 250 and 500 steps). The levers are bare steps with one
change each: bf16 autocast (only where the CPU runs bf16 natively), fused AdamW, torch.compile
(its compile time reported apart), a 16 x 256 batch.

Variants alternate within each round and each figure is the median over the rounds, so a slow
spell of the machine hits every variant alike. FLOPs utilisation is the model's training FLOPs
(6 per parameter per token, plus attention) against an fp32 peak estimated from the CPU's clock,
its vector width and the threads used; it is the same yardstick for every row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from bench import cpu_name
from model import GPT2, GPT2Config
from model.checkpoint import BUNDLED_DIR, save_pretrained
from model.tokenizer import SentencePieceTokenizer
from train import pretrain

BATCH, BLOCK = 8, 512
EVAL_EVERY, SAVE_EVERY = 250, 500  # as in the pretraining run (train.pretrain's defaults)


def training_flops_per_token(config: GPT2Config, block: int) -> float:
    """6 FLOPs per weight per token (forward 2, backward 4) for every matrix the tokens go through,
    the tied head included, plus attention's scores and mixing (12 per layer, position and width)."""
    matrices = config.n_layer * 12 * config.n_embd ** 2 + config.vocab_size * config.n_embd
    return 6 * matrices + 12 * config.n_layer * block * config.n_embd


def fp32_peak_flops() -> float | None:
    """Threads x clock x fp32 FLOPs per cycle (two FMA units: 64 with AVX-512, 32 with AVX2)."""
    flags = pretrain.cpu_flags()
    mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
           if line.startswith("cpu MHz")] if Path("/proc/cpuinfo").exists() else []
    if not mhz:
        return None
    per_cycle = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    return torch.get_num_threads() * max(mhz) * 1e6 * per_cycle


def bare_step(config: GPT2Config, batch: int = BATCH, block: int = BLOCK, bf16: bool = False, fused: bool = False,
              compiled: bool = False) -> tuple[Callable[[], None], float]:
    """A step function on its own model and one fixed batch; also the seconds compiling took."""
    torch.manual_seed(0)
    model = GPT2(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, config.vocab_size, (batch, block), generator=generator)
    y = torch.randint(0, config.vocab_size, (batch, block), generator=generator)
    forward = torch.compile(model) if compiled else model

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    started = time.perf_counter()
    if compiled:
        step()  # the compile happens here, outside the timed rounds
    return step, time.perf_counter() - started if compiled else 0.0


class OurLoop:
    """train.train on the real pretraining mix, continued round after round, with the precision
    train.pretrain picks here; validation and a checkpoint timed apart once per round."""

    def __init__(self, config: GPT2Config, bf16: bool, out: Path):
        tokenizer = SentencePieceTokenizer.from_file(BUNDLED_DIR / "tokenizer.model")
        weights = dict(pretrain.DEFAULT_MIX)
        streams = pretrain.mix_streams(tokenizer, weights)
        self.val = pretrain.pretraining_streams(tokenizer, "val")
        torch.manual_seed(0)
        self.model, self.tokenizer, self.out = GPT2(config), tokenizer, out
        self.settings = pretrain.TrainSettings(max_steps=10 ** 6, warmup_steps=100, bf16=bf16,
                                               eval_every=10 ** 9, save_every=10 ** 9)
        self.optimizer = pretrain.make_optimizer(self.model, self.settings)
        self.next_batch = pretrain.mixed_batches(streams, weights, BATCH, BLOCK, 1337, torch.device("cpu"))
        self.step = 0
        self.extra_s: list[float] = []  # validation and checkpoint seconds per step, as in the real run

    def run(self, steps: int) -> float:
        settings = pretrain.TrainSettings(**{**self.settings.__dict__, "max_steps": self.step + steps})
        started = time.perf_counter()
        pretrain.train(self.model, self.next_batch, settings, optimizer=self.optimizer, start_step=self.step,
                       log=lambda record: None, progress=False)
        loop_s = time.perf_counter() - started
        self.step += steps
        started = time.perf_counter()
        pretrain.validation_loss(self.model, self.val, BLOCK, torch.device("cpu"))
        eval_s = time.perf_counter() - started
        started = time.perf_counter()
        save_pretrained(self.model, self.tokenizer, self.out)
        torch.save({"step": self.step, "optimizer": self.optimizer.state_dict()}, self.out / "train_state.pt")
        save_s = time.perf_counter() - started
        return loop_s + steps * (eval_s / EVAL_EVERY + save_s / SAVE_EVERY)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds; each figure is the median over them")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it takes a minute)")
    p.add_argument("--model", type=Path, default=BUNDLED_DIR,
                   help="a checkpoint folder whose config.json gives the shape (default: assets/, the bundled model)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)

    config = GPT2Config.load(args.model)
    native = pretrain.native_bf16(torch.device("cpu"))
    variants: dict[str, tuple[Callable[[int], float], int]] = {}  # name: (run N steps -> seconds, tokens per step)

    def timed(step):
        def run(steps):
            step()  # one untimed step first: the allocator and caches settle
            started = time.perf_counter()
            for _ in range(steps):
                step()
            return time.perf_counter() - started
        return run

    variants["bare step (fp32, AdamW)"] = (timed(bare_step(config)[0]), BATCH * BLOCK)
    scratch = tempfile.TemporaryDirectory()
    loops = {"our loop (fp32)": OurLoop(config, False, Path(scratch.name) / "fp32")}
    if native:
        variants["bare step, bf16 autocast"] = (timed(bare_step(config, bf16=True)[0]), BATCH * BLOCK)
        loops["our loop (bf16, as train.pretrain picks here)"] = OurLoop(config, True, Path(scratch.name) / "bf16")
        variants["bare step, bf16, fused AdamW"] = (timed(bare_step(config, bf16=True, fused=True)[0]), BATCH * BLOCK)
    variants["bare step, fused AdamW"] = (timed(bare_step(config, fused=True)[0]), BATCH * BLOCK)
    variants["bare step, batch 16 x 256"] = (timed(bare_step(config, batch=16, block=256)[0]), 16 * 256)
    compile_s = None
    if not args.no_compile:
        step, compile_s = bare_step(config, bf16=native, compiled=True)
        variants[f"bare step, torch.compile{', bf16' if native else ''}"] = (timed(step), BATCH * BLOCK)
    for name, loop in loops.items():
        variants[name] = (lambda steps, loop=loop: (loop.run(1), loop.run(steps))[1], BATCH * BLOCK)

    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_number in range(args.rounds):
        for name, (run, tokens) in variants.items():
            rates[name].append(args.steps * tokens / run(args.steps))
        print(f"round {round_number + 1}/{args.rounds}: " +
              ", ".join(f"{name} {r[-1]:.0f}" for name, r in rates.items()), flush=True)
    scratch.cleanup()

    medians = {name: statistics.median(r) for name, r in rates.items()}
    flops, peak = training_flops_per_token(config, BLOCK), fp32_peak_flops()
    base = medians["bare step (fp32, AdamW)"]
    print(f"\nTraining speed of the bundled config ({config.n_layer} x {config.n_embd}, vocab {config.vocab_size}, "
          f"batch {BATCH} x {BLOCK}), {cpu_name()}, {torch.get_num_threads()} threads, native bf16: "
          f"{'yes' if native else 'no'}; median of {args.rounds} rounds of {args.steps} steps\n")
    print("| variant | tokens/s | vs bare fp32 | FLOPs utilisation (of fp32 peak) |")
    print("|---|---:|---:|---:|")
    for name, rate in medians.items():
        utilisation = f"{rate * flops / peak:.0%}" if peak else "—"
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {utilisation} |")
    if compile_s is not None:
        print(f"\ntorch.compile took {compile_s:.0f} s before its first step.")
    for name in loops:
        bare = "bare step, bf16 autocast" if "bf16" in name else "bare step (fp32, AdamW)"
        print(f"{name} is at {medians[name] / medians[bare]:.0%} of the {bare}.")
    if args.json:
        args.json.write_text(json.dumps({"tokens_per_s": medians, "compile_s": compile_s, "native_bf16": native,
                                         "flops_per_token": flops, "fp32_peak_flops": peak}, indent=2))


if __name__ == "__main__":
    main()

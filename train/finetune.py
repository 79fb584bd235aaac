"""Fine-tune one task's LoRA adapter with PEFT, on the prompt format the task uses with its adapter on.

    python -m train.finetune --task translate --data runs/task-data/translate-train.jsonl \\
        --val runs/task-data/translate-val.jsonl --out runs/adapters/translate

Each record becomes the task's own training pair, `task.format_example(inputs, target)` ->
(prompt, completion), so the adapter learns exactly what the app sends it. Only the completion
is learned (the prompt's labels are IGNORE), a prompt too long for the context loses its oldest
tokens, and batches are padded to their longest example. The base can be the bundled model, a
hub id such as `gpt2`, or any GPT-2 checkpoint directory; its weights stay frozen. The loop is
train.pretrain.train; the adapter is saved by PEFT itself (adapter_config.json +
adapter_model.safetensors), which model.adapters.load_adapter and PEFT + transformers both load.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.checkpoint import load_pretrained, pick_device
from model.tokenizer import Tokenizer
from tasks import TASKS

from .data import RECORD_FORMATS, example_from_record, read_records
from .pretrain import IGNORE, TrainSettings, add_precision_flag, pick_bf16, seed_everything, train

TARGET_MODULES = ["c_attn", "c_proj", "c_fc"]  # every projection of attention and MLP


@dataclass
class Example:
    ids: list[int]  # prompt then completion, at most the context + 1 tokens
    prompt_tokens: int  # how many of ids are prompt (not learned)


@dataclass
class Encoded:
    examples: list[Example]
    truncated: int  # prompts that lost their oldest tokens to fit the context
    skipped: int  # completions too long to fit with any prompt


def encode_records(task_name: str, records: list[dict], tokenizer: Tokenizer, n_ctx: int) -> Encoded:
    """Each record as its task's (prompt, completion) token ids, fitted to a context of n_ctx."""
    task = TASKS[task_name]
    # The inputs are ids[:-1], so an example of n_ctx + 1 tokens fills the context exactly.
    max_tokens = n_ctx + 1
    examples, truncated, skipped = [], 0, 0
    for record in records:
        prompt, completion = task.format_example(*example_from_record(task_name, record))
        # Encoded apart, as at inference: the model is given the prompt's ids and writes the completion's.
        prompt_ids, completion_ids = tokenizer.encode(prompt), tokenizer.encode(completion)
        room = max_tokens - len(completion_ids)
        if room < 1:
            skipped += 1
            continue
        if len(prompt_ids) > room:
            prompt_ids = prompt_ids[-room:]
            truncated += 1
        examples.append(Example(prompt_ids + completion_ids, len(prompt_ids)))
    return Encoded(examples, truncated, skipped)


def collate(examples: list[Example], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) padded on the right to the longest example; labels are IGNORE on prompt and padding."""
    width = max(len(e.ids) for e in examples) - 1
    inputs = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(examples):
        ids = torch.tensor(e.ids)
        inputs[row, :len(ids) - 1] = ids[:-1]
        # labels[i] is the token after inputs[i]; the first completion token follows the last prompt token.
        labels[row, e.prompt_tokens - 1:len(ids) - 1] = ids[e.prompt_tokens:]
    return inputs.to(device), labels.to(device)


@torch.no_grad()
def completion_nll(model: torch.nn.Module, examples: list[Example], pad_id: int,
                   batch_size: int = 16) -> tuple[float, int]:
    """Total negative log-likelihood (nats) of the completion tokens given their prompts, and their count.

    Right padding never changes the logits of the real tokens before it (attention is causal).
    """
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        x, y = collate(examples[start:start + batch_size], pad_id, device)
        logits = model(x)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE,
                                 reduction="sum").item()
        count += int((y != IGNORE).sum())
    return total, count


def epoch_batches(n_examples: int, batch_size: int, seed: int):
    """batch(step) -> example indices: a fresh shuffle each epoch, fixed by the seed and the step alone."""
    @functools.lru_cache(maxsize=2)
    def order(epoch: int) -> list[int]:
        return torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()

    def batch(step: int) -> list[int]:
        positions = range(step * batch_size, (step + 1) * batch_size)
        return [order(p // n_examples)[p % n_examples] for p in positions]
    return batch


def shown_path(path) -> str:
    """A path as files that may be shipped or committed record it: relative to here, else only its
    name, so that no machine's directories end up in them. Hub ids and names pass unchanged."""
    path = Path(str(path))
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def parse_args(argv=None) -> argparse.Namespace:
    formats = "\n".join(f"  {task}: {fmt}" for task, fmt in RECORD_FORMATS.items())
    p = argparse.ArgumentParser(
        prog="python -m train.finetune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a LoRA adapter (PEFT) for one task on a frozen GPT-2 base and save it in PEFT's format.",
        epilog=(f"--data and --val are JSONL files, one JSON object per line (other keys are ignored):\n{formats}\n"
                "`python -m train.data --out runs/task-data` writes these files for the project's own data.\n"
                "To ship an adapter with a checkpoint, copy --out to <checkpoint>/adapters/<task>/."))
    p.add_argument("--task", required=True, choices=list(RECORD_FORMATS), help="the task whose prompt format to train")
    p.add_argument("--data", type=Path, required=True, help="training records (JSONL, format below)")
    p.add_argument("--val", type=Path,
                   help="validation records; their completion loss is logged every --eval-every steps")
    p.add_argument("--out", type=Path, required=True,
                   help="directory for adapter_config.json, adapter_model.safetensors, train_log.jsonl and "
                        "finetune_args.json")
    p.add_argument("--base", default=None,
                   help="base model: a checkpoint directory or a hub id such as gpt2 (default: the bundled model)")
    p.add_argument("--init-adapter", type=Path, default=None, metavar="ADAPTER_DIR",
                   help="continue training this PEFT adapter (its rank, alpha and target modules) instead of a "
                        "new one; --rank, --alpha and --dropout are then ignored")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank r: the width of each low-rank update")
    p.add_argument("--alpha", type=float, default=16, help="LoRA alpha; updates are scaled by alpha / rank")
    p.add_argument("--dropout", type=float, default=0.05, help="dropout on the LoRA input during training")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps; the cosine schedule ends here")
    p.add_argument("--batch-size", type=int, default=16, help="examples per step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=30, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay on the LoRA matrices")
    p.add_argument("--eval-every", type=int, default=50, help="log the loss (and --val loss) every N steps")
    p.add_argument("--val-examples", type=int, default=200, help="use at most the first N --val records")
    p.add_argument("--max-examples", type=int, default=0, help="train on at most the first N --data records (0 = all)")
    p.add_argument("--seed", type=int, default=1337, help="seed for the LoRA initialisation and the batch order")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    add_precision_flag(p)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch (0 = torch's default); 1 is faster when another job shares the cores")
    args = p.parse_args(argv)
    for name in ("rank", "steps", "batch_size", "eval_every", "val_examples"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_examples < 0 or args.warmup_steps < 0 or args.threads < 0:
        p.error("--max-examples, --warmup-steps and --threads cannot be negative")
    return args


def main(argv=None) -> list[dict]:
    """Train and save the adapter; returns the logged records (step 0 is before training)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    seed_everything(args.seed)
    model, tokenizer = load_pretrained(args.base, device=device)
    n_ctx = model.config.n_positions

    records = read_records(args.data, args.task, limit=args.max_examples or None)
    train_set = encode_records(args.task, records, tokenizer, n_ctx)
    if not train_set.examples:
        raise ValueError(f"{args.data}: no example fits the {n_ctx}-token context")
    print(f"{args.task}: {len(train_set.examples):,} training examples from {args.data} "
          f"({train_set.truncated} prompts cut to fit, {train_set.skipped} skipped: completion too long)")
    val_set = (encode_records(args.task, read_records(args.val, args.task, limit=args.val_examples), tokenizer, n_ctx)
               if args.val else None)

    base_parameters = model.num_parameters()  # counted before PEFT adds the LoRA matrices to the model
    if args.init_adapter:
        peft_model = PeftModel.from_pretrained(model, args.init_adapter, is_trainable=True)
        args.rank = peft_model.peft_config["default"].r
    else:
        lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=args.dropout,
                          target_modules=TARGET_MODULES)
        peft_model = get_peft_model(model, lora)
    peft_model.peft_config["default"].base_model_name_or_path = shown_path(args.base or "bundled")
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    print(f"base {args.base or 'bundled'}: {base_parameters:,} parameters (frozen), "
          f"LoRA r={args.rank}: {trainable:,} trainable")

    pad_id = tokenizer.eos_id  # any id: padding is never attended to by real tokens nor scored
    batch = epoch_batches(len(train_set.examples), args.batch_size, args.seed)

    def next_batch(step):
        return collate([train_set.examples[i] for i in batch(step)], pad_id, device)

    def evaluate() -> dict[str, float]:
        if val_set is None:
            return {}
        total, count = completion_nll(peft_model, val_set.examples, pad_id)
        return {"val_loss": total / count}

    args.out.mkdir(parents=True, exist_ok=True)
    settings = TrainSettings(max_steps=args.steps, lr=args.lr, warmup_steps=args.warmup_steps,
                             weight_decay=args.weight_decay, eval_every=args.eval_every, save_every=args.steps,
                             seed=args.seed, bf16=pick_bf16(args.precision, device))
    recorded = {k: shown_path(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    recorded["base"] = shown_path(args.base or "bundled")
    (args.out / "finetune_args.json").write_text(json.dumps(
        {**recorded, "train_examples": len(train_set.examples), "settings": asdict(settings)}, indent=2))
    log_path = args.out / "train_log.jsonl"
    log_path.unlink(missing_ok=True)
    logged = []

    def log(record):
        logged.append(record)
        tqdm.write(json.dumps(record))
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    if val_set is not None:
        peft_model.eval()
        log({"step": 0, **evaluate()})  # a new LoRA starts as a no-op: then this is the base model's loss
    history = train(peft_model, next_batch, settings, evaluate=evaluate, log=log)
    if not math.isfinite(history[-1]["loss"]):
        raise RuntimeError(f"training diverged at step {history[-1]['step']} (loss {history[-1]['loss']}); "
                           "lower --lr; nothing was saved")
    placeholder_card = not (args.out / "README.md").exists()
    peft_model.save_pretrained(args.out, save_embedding_layers=False)  # embeddings are frozen: nothing to save
    if placeholder_card:
        # PEFT writes a template model card; the card of the checkpoint that ships the adapter describes it.
        (args.out / "README.md").unlink(missing_ok=True)
    print(f"saved the {args.task} adapter to {args.out}")
    return logged


if __name__ == "__main__":
    main()

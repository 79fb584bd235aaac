#!/usr/bin/env bash
# Build what assets/ ships from a pretrained base (python -m train.pretrain --out runs/bundled ...):
# the task data splits, one LoRA adapter per task, the evaluation table, and the model card.
# Usage: bash scripts/build_bundled.sh "TRAINING TIME" ["NOTES FOR THE CARD"]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BASE=${BASE:-runs/bundled}
DATA=runs/task-data
COMMON=(--base "$BASE" --seed 1337)

$PY -m tasks.data --out "$DATA"
$PY -m tasks.finetune --task translate --data "$DATA/translate-train.jsonl" --val "$DATA/translate-val.jsonl" \
  --out runs/adapters/translate --steps 1000 --batch-size 32 --eval-every 100 --lr 3e-3 --warmup-steps 50 "${COMMON[@]}"
$PY -m tasks.finetune --task dialogue --data "$DATA/dialogue-train.jsonl" --val "$DATA/dialogue-val.jsonl" \
  --out runs/adapters/dialogue --steps 250 --batch-size 8 --eval-every 100 --lr 2e-3 --warmup-steps 30 "${COMMON[@]}"
$PY -m tasks.finetune --task summarize --data "$DATA/summarize-train.jsonl" --val "$DATA/summarize-val.jsonl" \
  --out runs/adapters/summarize --steps 120 --batch-size 8 --lr 2e-3 --warmup-steps 30 "${COMMON[@]}"

# Ship: the base in HF layout and each adapter's two PEFT files.
mkdir -p assets/adapters
cp "$BASE/config.json" "$BASE/model.safetensors" "$BASE/tokenizer.model" assets/
for task in translate dialogue summarize; do
  mkdir -p "assets/adapters/$task"
  cp "runs/adapters/$task/adapter_config.json" "runs/adapters/$task/adapter_model.safetensors" "assets/adapters/$task/"
done
mkdir -p docs/training
cp "$BASE/log.jsonl" docs/training/pretrain-log.jsonl
cp "$BASE/train_args.json" docs/training/pretrain-args.json
for task in translate dialogue summarize; do cp "runs/adapters/$task/train_log.jsonl" "docs/training/$task-log.jsonl"; done

$PY -m tasks.eval --model bundled --data "$DATA" --out docs/eval-bundled.md
$PY scripts/model_card.py --train-dir "$BASE" --eval docs/eval-bundled.json --training-time "$1" --notes "${2:-}"

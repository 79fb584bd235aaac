#!/usr/bin/env bash
# Build what assets/ ships from a pretrained base (python -m train.pretrain --out runs/bundled ...):
# the task data splits, one LoRA adapter per task, the evaluation table, and the model card.
# Usage: bash scripts/build_bundled.sh "TRAINING TIME" ["NOTES FOR THE CARD"]
# STAGE=adapters stops after training the adapters, and STAGE=ship starts after it, from adapters in
# runs/adapters (scripts/device_build.sh trains them on a lent GPU and ships them here).
# The adapters' step counts are where their held-out loss stopped falling in the last build (translate
# nearly so; longer dialogue and summarisation runs did no better: docs/training/<task>-log.jsonl);
# the evaluation decides which start on (train.eval --on-by-default).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BASE=${BASE:-runs/bundled}
: "${1:?usage: bash scripts/build_bundled.sh \"TRAINING TIME\" [\"NOTES FOR THE CARD\"]}"
for file in config.json model.safetensors tokenizer.model training.json log.jsonl train_args.json; do
  [[ -f "$BASE/$file" ]] || { echo "build_bundled.sh: $BASE/$file is missing: is BASE a finished train.pretrain run?" >&2; exit 1; }
done
DATA=runs/task-data
COMMON=(--base "$BASE" --seed 1337)
STAGE=${STAGE:-all}

$PY -m train.data --out "$DATA"
if [[ $STAGE != ship ]]; then
  $PY -m train.finetune --task translate --data "$DATA/translate-train.jsonl" --val "$DATA/translate-val.jsonl" \
    --out runs/adapters/translate --steps "${TRANSLATE_STEPS:-4000}" --batch-size 32 --rank 16 --alpha 32 \
    --eval-every 500 --lr 3e-3 --warmup-steps 50 "${COMMON[@]}"
  $PY -m train.finetune --task dialogue --data "$DATA/dialogue-train.jsonl" --val "$DATA/dialogue-val.jsonl" \
    --out runs/adapters/dialogue --steps "${DIALOGUE_STEPS:-250}" --batch-size 16 --eval-every 50 --lr 2e-3 \
    --warmup-steps 30 "${COMMON[@]}"
  $PY -m train.finetune --task summarize --data "$DATA/summarize-train.jsonl" --val "$DATA/summarize-val.jsonl" \
    --out runs/adapters/summarize --steps "${SUMMARIZE_STEPS:-150}" --batch-size 8 --eval-every 50 --lr 2e-3 \
    --warmup-steps 30 "${COMMON[@]}"
fi
[[ $STAGE == adapters ]] && exit 0

# Evaluate the run before it replaces anything: assets/ changes only when the held-out evaluation
# improves on the model shipped now (better somewhere, worse nowhere, beyond the noise of a bootstrap
# over the same validation items where both evaluations kept them), whose evaluation then becomes
# the card's "before".
# The adapters that beat the prompt alone start on: runs/adapters/on_by_default.json, shipped with them.
$PY -m train.eval --model "$BASE" --adapters runs/adapters --data "$DATA" --out runs/eval-candidate.md \
  --on-by-default runs/adapters
$PY scripts/model_card.py --check-improves --eval runs/eval-candidate.json --before docs/eval-bundled.json
for ext in md json; do
  cp "docs/eval-bundled.$ext" "docs/training/eval-previous.$ext"
  mv "runs/eval-candidate.$ext" "docs/eval-bundled.$ext"
done

# Ship: the base in HF layout with its training record, and each adapter's two PEFT files.
mkdir -p assets/adapters
cp "$BASE/config.json" "$BASE/model.safetensors" "$BASE/tokenizer.model" "$BASE/training.json" assets/
for task in translate dialogue summarize; do
  mkdir -p "assets/adapters/$task"
  cp "runs/adapters/$task/adapter_config.json" "runs/adapters/$task/adapter_model.safetensors" "assets/adapters/$task/"
done
cp runs/adapters/on_by_default.json assets/adapters/
mkdir -p docs/training
cp "$BASE/log.jsonl" docs/training/pretrain-log.jsonl
cp "$BASE/train_args.json" docs/training/pretrain-args.json
for task in translate dialogue summarize; do cp "runs/adapters/$task/train_log.jsonl" "docs/training/$task-log.jsonl"; done
$PY scripts/model_card.py --eval docs/eval-bundled.json --training-time "$1" --notes "${2:-}"

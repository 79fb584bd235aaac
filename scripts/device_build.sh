#!/usr/bin/env bash
# A new edition of the bundled model trained on a lent GPU (the `device` tool, DEVELOPERS.md) in one
# call there; its evaluation, the shipping gate and the card are made here, as for any edition.
#
#   bash scripts/device_build.sh pack            # here: runs/device/ (ignored by git): the project's
#                                                # data and the wheels the device lacks, to travel
#   device run, carry ["runs/device"], timeout_s 540:
#     bash scripts/device_build.sh train 4       # there: a tokenizer, a base trained for 4 minutes and
#                                                # its three adapters, as $OUT/edition.tar.part-*
#   bash scripts/device_build.sh unpack DIR      # here: DIR's parts -> runs/bundled, runs/adapters
#   STAGE=ship bash scripts/build_bundled.sh "4 minutes"    # evaluate, gate, ship
#
# The tokenizer is trained again on training records alone (scripts/train_tokenizer.py: the shipped
# one saw every split), so the base starts from scratch. Its shape is N_LAYER x N_EMBD, 6 x 256 by
# default: the size sweep's next size up (docs/training/size-sweep.md), and the data's size bounds
# it too, about 30M tokens of text, which a GPU goes through many times in a few minutes. assets/
# must stay under 60 MB: about 14M parameters in fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=runs/device
FILES_BACK=(runs/bundled/{config.json,model.safetensors,tokenizer.model,training.json,log.jsonl,train_args.json})

case "${1:-}" in
pack)
  PY=${PY:-.venv/bin/python}
  rm -rf "$PACK" && mkdir -p "$PACK/wheels"
  tar -cJf "$PACK/data.tar.xz" -C "${STUDIO_DATA_DIR:-../shared/data}" .
  # The device's Python has PyTorch, PEFT, SentencePiece, sacrebleu and safetensors; not these.
  $PY -m pip wheel -q --no-deps -w "$PACK/wheels" rouge-score==0.1.2 nltk==3.10.4 2>&1 | grep -v WARNING || true
  tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
  packed=$(du -sb "$PACK" | cut -f1)
  echo "to travel: $(( (tree + packed) / 2**20 )) MiB (the working tree and $PACK; the limit is 64)"
  ;;
train)
  minutes=${2:?usage: bash scripts/device_build.sh train MINUTES}
  export PY=${PY:-python3}
  if ! $PY -c "import rouge_score" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --target /tmp/site "$PACK"/wheels/*.whl
    export PYTHONPATH=/tmp/site
  fi
  export STUDIO_DATA_DIR=/tmp/studio-data
  mkdir -p "$STUDIO_DATA_DIR" runs/edition && tar -xJf "$PACK/data.tar.xz" -C "$STUDIO_DATA_DIR"
  $PY scripts/train_tokenizer.py --out runs/edition/tokenizer
  $PY -m train.pretrain --out runs/bundled --tokenizer runs/edition/tokenizer.model --minutes "$minutes" \
    --n-layer "${N_LAYER:-6}" --n-embd "${N_EMBD:-256}" --n-head "${N_HEAD:-8}" --block-size 512 \
    --batch-size "${BATCH_SIZE:-64}" --lr "${LR:-2e-3}" --warmup-steps 200 --device "${DEVICE:-cuda}" \
    --mix ${MIX:-tinystories=0.2 gutenberg=0.25 translation=0.4 dialogue=0.1 summaries=0.05}
  STAGE=adapters bash scripts/build_bundled.sh "$minutes minutes"
  # At most 8 files of 16 MB come back: the whole edition as one tar, in parts.
  tar -c "${FILES_BACK[@]}" runs/adapters/*/{adapter_config.json,adapter_model.safetensors,train_log.jsonl,finetune_args.json} \
    | split -b 15M - "${OUT:?OUT: the folder whose files come back}/edition.tar.part-"
  ls -l "$OUT"
  ;;
unpack)
  cat "${2:?usage: bash scripts/device_build.sh unpack DIR}"/edition.tar.part-* | tar -x
  echo "unpacked: runs/bundled, runs/adapters; next: STAGE=ship bash scripts/build_bundled.sh \"TRAINING TIME\""
  ;;
*)
  echo "usage: bash scripts/device_build.sh pack | train MINUTES | unpack DIR" >&2
  exit 2
  ;;
esac

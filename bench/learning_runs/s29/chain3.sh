#!/bin/bash
# session 29: the quote+restate SFT from scratch with turns that fit 192 tokens ("qs"), then its evals.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s29
date
$A run-all --demo --preset learn --config $R/qr.toml --out $R/qs > $R/qs.log 2>&1
date
$A eval $R/qs/real/test.jsonl --model $R/qs/sft --search local:$R/qs/real/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/qr_transfer.json -o $R/ev/qs_transfer.json --answers $R/ev/qs_transfer.parquet
date
$A eval $R/qs/world/test.jsonl --model $R/qs/sft --search local:$R/qs/world/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/qr_demo.json -o $R/ev/qs_demo.json --answers $R/ev/qs_demo.parquet
date
echo CHAIN3 DONE

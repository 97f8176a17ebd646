#!/bin/bash
# session 29: the quote+restate SFT from scratch, then its transfer and demo test evals. One model job at a time.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s29
P=runs/s28/ev
date
$A run-all --demo --preset learn --config $R/qr.toml --out $R/qr > $R/qr.log 2>&1
date
mkdir -p $R/ev
$A eval $R/qr/real/test.jsonl --model $R/qr/sft --search local:$R/qr/real/index.sqlite --config $R/b_eval.toml \
  --compare $P/sq_transfer.json -o $R/ev/qr_transfer.json --answers $R/ev/qr_transfer.parquet
date
$A eval $R/qr/world/test.jsonl --model $R/qr/sft --search local:$R/qr/world/index.sqlite --config $R/b_eval.toml \
  --compare $P/sq_demo.json -o $R/ev/qr_demo.json --answers $R/ev/qr_demo.parquet
date
echo CHAIN DONE

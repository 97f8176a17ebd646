#!/bin/bash
# session 30: the goal-first quoting SFT on the enlarged real split (265 real rows), then its demo eval.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s30
date
$A run-all --demo --preset learn --config $R/qr.toml --out $R/e1 > $R/e1.log 2>&1
date
$A eval $R/e1/world/test.jsonl --model $R/e1/sft --search local:$R/e1/world/index.sqlite --config $R/b_eval.toml \
  --compare runs/s29/ev/qg_demo.json -o $R/ev/e1_demo.json --answers $R/ev/e1_demo.parquet
date
echo CHAIN1 DONE

#!/bin/bash
# session 30: e3 = the SFT from scratch with the goal-first real expert (commit 2d5a75b; 303 real rows), then its
# demo eval. Waits for chain1 (e1). One model job at a time.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s30
while ! grep -q "CHAIN1 DONE" $R/chain1.log; do sleep 20; done
date
$A run-all --demo --preset learn --config $R/qr.toml --out $R/e3 > $R/e3.log 2>&1
date
$A eval $R/e3/world/test.jsonl --model $R/e3/sft --search local:$R/e3/world/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/e1_demo.json -o $R/ev/e3_demo.json --answers $R/ev/e3_demo.parquet
date
echo CHAIN3 DONE

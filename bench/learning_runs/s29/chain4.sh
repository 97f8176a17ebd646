#!/bin/bash
# session 29: the goal-first quoting SFT from scratch ("qg"), then its evals; waits for the test suite.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s29
while pgrep -f "pytest" >/dev/null; do sleep 15; done
date
$A run-all --demo --preset learn --config $R/qr.toml --out $R/qg > $R/qg.log 2>&1
date
$A eval $R/qg/world/test.jsonl --model $R/qg/sft --search local:$R/qg/world/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/qs_demo.json -o $R/ev/qg_demo.json --answers $R/ev/qg_demo.parquet
date
echo CHAIN4 DONE
